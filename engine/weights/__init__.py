"""The weight types every loader, quantizer and kernel shares, with no dependency on any of them:
IntWeight (w = s (q - z), as GPTQ and AWQ define it), QuantWeight (w = d q + m per contiguous
group, as the kernels run it), PackedWeight (a QuantWeight in the kernels' tiles), and
round-to-nearest, the one quantizer a loader uses itself.
"""
