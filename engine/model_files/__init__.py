"""Model-file facts, one definition each, shared by app/, ui/ and engine/: no torch, no llama_cpp.

- gguf_file: the GGUF header reader (metadata and tensor directory over an mmap)
- meta: what a model file or GPTQ/AWQ directory says it is
- quant_config: a GPTQ/AWQ/compressed-tensors quantization_config, read and written
- manifest: the model store's layout, model ids, and the one manifest schema (read and write)
- bundled: the bundled default model and its id
- fit: footprint, KV-size arithmetic, the default context cap, and the fit rule (choose_backend)

tests/test_import_rules.py holds ui/ and the GUI's path to these modules of engine/.
"""
