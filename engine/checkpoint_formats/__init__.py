"""The checkpoint layouts of one quantized linear, one module per layout (gptq.py: GPTQ v1/v2,
awq.py: AWQ GEMM, compressed_tensors.py: llm-compressor's pack-quantized), each with its tensor
names and both directions: `decode` (a checkpoint's int32 words -> IntWeight, on load) and
`encode` (IntWeight -> the words, for `ember quantize`'s writer). registry.py picks the module
by the config's format; the quantization_config itself is engine/model_files/quant_config.py.

Notation: N = out_features, K = in_features, b = bits, P = 32 // b codes per int32 word,
G = group_size (-1: one group spans K), n_g = ceil(K / G) (1 when G = -1). Codes and zero points
are unsigned, 0 .. 2^b - 1, exactly IntWeight's q and zeros:  w[n, k] = s[n, g(k)] (q[n, k] - z[n, g(k)]).
"Packed along an axis" means P consecutive codes per int32 word, the first in the lowest bits:
    code[i] = (word[i // P] >> b (i % P)) & (2^b - 1)      (words are int32 bit patterns)
"""
