"""`ember quantize`: the offline quantizers (GPTQ, AWQ; round-to-nearest is engine/weights/rtn.py,
which the loaders use too), their calibration, and the pipeline that writes a checkpoint.

Every quantizer produces one thing: an IntWeight (engine/weights/int_weight.py), w = s (q - z)
per group; the checkpoint layouts that carry it are engine/checkpoint_formats/. Nothing outside
`ember quantize` (and its bench) imports this package.
"""
