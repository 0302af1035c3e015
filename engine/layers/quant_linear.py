"""QuantLinear: y = x W^T + b with W kept 4- or 8-bit, through Ember's CPU kernels.

The weight comes in as a QuantWeight (engine/weights/quant_weight.py: exact integer codes and group
scales, e.g. a GGUF tensor repacked) and is interleaved once, at load, into the tiles that
engine/kernels/csrc/qlinear.cpp reads; activations are quantized to int8 per row and per 32
values inside the op. Every row gets the same bits whatever the batch around it, so batched
greedy decoding stays identical to decoding alone, and every code path gives the same bits.

`rows(ids)` reads whole rows back as float32: a tied embedding looks its tokens up in the
quantized head, so the table exists once, at the file's own size.
"""
from __future__ import annotations

import copy

import torch

from engine.kernels import CpuPath, default_path, kernels
from engine.kernels.tiles import TILE, to_tiles
from engine.layers.linear import LinearBase
from engine.weights.quant_weight import QuantWeight, widen


class QuantLinear(LinearBase):
    def __init__(self, weight: QuantWeight, bias: torch.Tensor | None = None,
                 path: CpuPath | None = None) -> None:
        super().__init__()
        self.ops = kernels()
        if self.ops is None:
            raise RuntimeError("QuantLinear needs Ember's CPU kernels (engine/kernels), which are not available")
        if weight.group not in (16, 32):  # GPTQ/AWQ groups of 64, 128, K: the kernels' 32 (exact)
            weight = widen(weight, weight.bits, 32, weight.m is not None)
        p = to_tiles(weight)
        # act-order GPTQ: the tiles hold the columns in group order; x is put in it per call
        self.perm = None if weight.perm is None else torch.nn.Parameter(weight.perm, requires_grad=False)
        self.out_features, self.in_features = p.out_features, p.in_features
        self.bits, self.group = p.bits, p.group
        self.path = int(default_path() if path is None else path)
        self.qw = torch.nn.Parameter(p.qw, requires_grad=False)
        self.scales = torch.nn.Parameter(p.d, requires_grad=False)
        self.mins = None if p.m is None else torch.nn.Parameter(p.m, requires_grad=False)
        # K-quants: scales/mins above are 8-bit codes, these their float16 super-block scales
        self.scales_super = None if p.d_super is None else torch.nn.Parameter(p.d_super, requires_grad=False)
        self.mins_super = None if p.m_super is None else torch.nn.Parameter(p.m_super, requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias.float().contiguous(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).float()
        x2 = (x2 if self.perm is None else x2.index_select(1, self.perm)).contiguous()
        y = self.ops.qlinear(x2, self.qw, self.scales, self.mins, self.bias, self.out_features,
                             self.bits, self.group, self.path, self.scales_super, self.mins_super)
        return y.view(*shape[:-1], self.out_features)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 [len(ids), in_features]: rows `ids` of W, dequantized (w = d q + m)."""
        if self.perm is not None:
            raise ValueError("an act-order (permuted) weight is not an embedding table")
        return self.ops.qrows(self.qw, self.scales, self.mins, ids, self.in_features, self.bits, self.group,
                              self.scales_super, self.mins_super, self.out_features)

    def first_rows(self, n: int) -> QuantLinear:
        """The layer of W's first n output rows, sharing this one's storage (a draft's LM head cut to
        its common tokens). The tiles hold TILE rows each, stored tile after tile, so the first
        n / TILE tiles of codes and scales are the first n rows; n must be a multiple of TILE."""
        if n % TILE or not 0 < n <= self.out_features:
            raise ValueError(f"{n} rows: not a multiple of {TILE} in 1..{self.out_features}")
        small = copy.copy(self)
        small._parameters = dict(self._parameters)  # nn.Module keeps parameters here; never share the dict
        tiles = n // TILE
        for name in ("qw", "scales", "mins", "scales_super", "mins_super"):
            t = getattr(self, name)
            if t is not None:
                setattr(small, name, torch.nn.Parameter(t.data[:tiles], requires_grad=False))
        if self.bias is not None:
            small.bias = torch.nn.Parameter(self.bias.data[:n], requires_grad=False)
        small.out_features = n
        return small

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.bits}-bit, group {self.group}"
