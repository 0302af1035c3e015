"""Linear layers behind one small interface: `forward(x) -> x @ W^T + b` with W [out, in].

Two float kinds exist: `DenseLinear` (F.linear, any device and dtype) and `PackedLinear`, the
CPU float32 path. PackedLinear hands the weight to oneDNN once, at load, in its blocked layout
(`mkldnn._reorder_linear_weight`), so no GEMM call re-packs it: on an AVX2 CPU at 16 rows that
runs 2-3x faster than MKL's F.linear (576x49152 LM head: 15 ms against 40 ms), is never slower at
1 row, and gives every row the same bits whatever the batch (no per-M kernel switch), which keeps
batched greedy decoding identical to decoding alone. A QuantWeight (4/8-bit codes and group
scales) gives engine/layers/quant_linear.QuantLinear through the same `make_linear`
(engine/layers/make_linear.py), without touching model code (on a CUDA GPU:
engine/layers/int4_linear.Int4Linear). Fused projections (qkv, gate_up) are ordinary Linears over
row-concatenated weights:
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

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 rows `ids` of W: the embedding lookup of a tied head held dense (a GPU's 8-bit one)."""
        return self.weight[ids].float()


class PackedLinear(LinearBase):
    """y = x W^T + b with W held in oneDNN's blocked layout (CPU, float32 only).

    The packed tensor replaces the plain weight (no second copy); it cannot be indexed or
    viewed, only passed back to oneDNN."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())
        self.weight = torch.nn.Parameter(packed, requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias.float().contiguous(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).float().contiguous()
        if x2.shape[0] == 0:
            return x2.new_empty(*shape[:-1], self.out_features)
        y = torch.ops.mkldnn._linear_pointwise(x2, self.weight, self.bias, "none", [], "")
        return y.view(*shape[:-1], self.out_features)


def packed_linear_available(weight: torch.Tensor) -> bool:
    """oneDNN packing applies to float32 weights on a CPU build of torch that has oneDNN."""
    return (weight.dtype == torch.float32 and weight.device.type == "cpu"
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"))

