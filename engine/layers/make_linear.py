"""make_linear: the one place that picks a linear layer class for a weight.

It sits above the classes (engine/layers/linear.py's float kinds, quant_linear.QuantLinear,
int4_linear.Int4Linear), so each class file imports only what lies below it.
"""
from __future__ import annotations

import torch

from engine.layers.int4_linear import Int4Linear, supports
from engine.layers.linear import DenseLinear, LinearBase, PackedLinear, packed_linear_available
from engine.layers.quant_linear import QuantLinear
from engine.weights.quant_weight import QuantWeight


def make_linear(weight, bias: torch.Tensor | None = None, kind: str = "auto") -> LinearBase:
    """Build the linear layer of `kind` from a float weight [out, in] (and optional bias [out]),
    or from a QuantWeight (engine/weights/quant_weight.py): a QuantLinear, or on a CUDA GPU an
    Int4Linear (bf16 dense where tinygemm cannot take the weight).
    "auto" packs float32 CPU weights for oneDNN and keeps everything else dense."""
    if isinstance(weight, QuantWeight):
        if weight.q.device.type == "cuda":  # tinygemm for 4-bit, bf16 for the rest
            if supports(weight):
                return Int4Linear(weight, bias)
            return DenseLinear(weight.dequantize().to(torch.bfloat16), bias)
        return QuantLinear(weight, bias)
    if kind == "auto":
        kind = "packed" if packed_linear_available(weight) else "dense"
    if kind == "dense":
        return DenseLinear(weight, bias)
    if kind == "packed":
        return PackedLinear(weight, bias)
    raise ValueError(f"unknown linear kind {kind!r}")
