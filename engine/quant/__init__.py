"""Weight quantization: the RTN, GPTQ and AWQ quantizers, the checkpoint formats that carry
their results (GPTQ v1/v2, AWQ GEMM, compressed-tensors) and `ember quantize`'s pipeline.

Every quantizer produces, and every format packs and unpacks, one thing: an IntWeight
(engine/quant/int_weight.py), w = s (q - z) per group; the loader turns it into the kernels'
QuantWeight.
"""
