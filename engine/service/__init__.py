"""The engine in service: the one thread that owns the LLMEngine, the commands handlers post to it,
the model it serves and how it is loaded, its metrics, and the process's malloc diagnostics."""
