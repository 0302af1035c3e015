"""Model-file facts, one definition each, shared by app/, ui/ and engine/: no torch, no llama_cpp.

- gguf_file: the GGUF header reader (metadata and tensor directory over an mmap)
- meta: what a model file or GPTQ/AWQ directory says it is
- families: the one table of the dense families Ember's engine runs; architectures: what each runner runs
- quant_config: a GPTQ/AWQ/compressed-tensors quantization_config, read and written
- manifest: the model store's layout, model ids, and the one manifest schema (read and write)
- bundled: the bundled default model and its id
- footprint, memory: a model's memory shape, KV-size and pool arithmetic, the default context cap
- fit: the fit rule (choose_backend), behind the engine's backend choice and the GUI's badge
- tool_call_syntax: tool calls in a model's own syntax; errors: ModelFileError
- bert_folder, bert_gguf, safetensors_file: a sentence-transformers BERT folder converted to the
  GGUF llama.cpp embeds (the store's import of embedders), torch-free

tests/test_import_rules.py holds ui/ and the GUI's path to these modules of engine/.
"""
