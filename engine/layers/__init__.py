"""The torch layers of the Python forward: paged attention, RoPE, RMSNorm, the linear kinds (dense,
CPU-quantized, CUDA int4) and make_linear that picks one, and decoder_stack.py, which hands a
fully quantized model's layers to the native C++ stack instead."""
