"""Linear layers behind one small interface: `forward(x) -> x @ W^T + b` with W [out, in].

Only the dense kind exists here; int8/int4 kinds (same constructor contract: built from a float
weight or from packed checkpoint tensors) plug in through `make_linear` later without touching
model code. Fused projections (qkv, gate_up) are ordinary Linears over row-concatenated weights:
y = x @ [Wq; Wk; Wv]^T = [x Wq^T | x Wk^T | x Wv^T], split by the caller.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class LinearBase(torch.nn.Module):
    in_features: int
    out_features: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError


class DenseLinear(LinearBase):
    """y = x W^T + b in the weight's dtype (bf16/fp16/fp32); inputs are cast to it."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias.to(weight.dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias)


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None = None, kind: str = "dense") -> LinearBase:
    """Build the linear layer of `kind` from a float weight [out, in] (and optional bias [out])."""
    if kind == "dense":
        return DenseLinear(weight, bias)
    raise ValueError(f"unknown linear kind {kind!r}")
