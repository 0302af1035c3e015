"""Int4Linear: 4-bit GGUF weights on a CUDA GPU, through torch's tinygemm kernel.

`torch._weight_int4pack_mm` (gpt-fast's int4 path: bf16 activations, sm80+, groups of 32 to
256) reads the codes 4-bit for the few rows of a decode step; a long prefill chunk is a real
matrix product, where tinygemm is slow, so above DENSE_ROWS rows the weight is dequantized to
bf16 for that call and cuBLAS does it (vLLM's GPTQ kernels switch the same way). The layout
tinygemm wants is its own (`_convert_weight_to_int4pack`), so the plain codes are kept beside
it for the dense path and for embedding rows: 1 byte a weight in all, half of bf16.

tinygemm dequantizes w = (q - 8) scale + zero; a QuantWeight is w = d q + m, so scale = d
and zero = m + 8 d (`scales_and_zeros`, checked on the CPU twin of the kernel in
tests/kernels/test_int4_linear.py). Both are bf16 there: the price of the kernel, measured by
tools/cuda_check.py on a GPU.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.layers.linear import LinearBase
from engine.weights.quant_weight import QuantWeight

# Above this many rows, dequantize to bf16 and use a dense matrix product. Where the two cross,
# on an H200 (torch 2.11), Qwen2.5-1.5B's 28 layers of matrices (tools/cuda_check.py --layers-only):
# tinygemm 8.0 / 14.0 / 26.1 / 49.9 ms at 64 / 128 / 256 / 512 rows, dequantize + bf16 26.6 /
# 26.6 / 27.8 / 27.7 ms. At 32 (the old value) 64 chats dequantized every matrix every step:
# 111.5 ms a step, 83.2 ms at 256.
DENSE_ROWS = 256
GROUPS = (32, 64, 128, 256)  # the group sizes tinygemm takes


def scales_and_zeros(w: QuantWeight) -> torch.Tensor:
    """[K/G, N, 2] bf16 (scale, zero) with (q - 8) scale + zero = d q + m."""
    m = torch.zeros_like(w.d) if w.m is None else w.m
    return torch.stack((w.d, m + 8 * w.d), dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)


def nibble_pairs(q: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 [N, K] -> [N, K/2], code 2i in the high nibble (tinygemm's input)."""
    return (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)


def supports(w: QuantWeight) -> bool:
    """tinygemm packs columns in tiles of 8 (n = tiles * 8 must equal the scales' N: a 459-row
    head failed 'qScaleAndZeros.size(1) == n' on an H200) and rows in groups of 32."""
    return w.bits == 4 and w.group in GROUPS and w.shape[1] % 32 == 0 and w.shape[0] % 8 == 0


def inner_k_tiles(K: int) -> int:
    """tinygemm's K tiling: 8, 4 or 2 tiles of 16, whichever divides K."""
    return next(t for t in (8, 4, 2) if K % (16 * t) == 0)


class Int4Linear(LinearBase):
    def __init__(self, w: QuantWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if not supports(w):
            raise ValueError(f"tinygemm takes 4-bit weights in groups of {GROUPS}, not {w.bits}-bit, group {w.group}")
        self.out_features, self.in_features = w.shape
        self.group = w.group
        codes = nibble_pairs(w.q)
        self.perm = None if w.perm is None else torch.nn.Parameter(w.perm, requires_grad=False)  # act-order
        self.codes = torch.nn.Parameter(codes, requires_grad=False)
        self.packed = torch.nn.Parameter(
            torch._convert_weight_to_int4pack(codes, inner_k_tiles(self.in_features)), requires_grad=False)
        self.sz = torch.nn.Parameter(scales_and_zeros(w).to(codes.device), requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias.to(codes.device, torch.bfloat16),
                                                                 requires_grad=False)

    def dense(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """bf16 W [N, K] (or its rows `rows`), dequantized as tinygemm does."""
        c = self.codes if rows is None else self.codes[rows]
        q = torch.stack((c >> 4, c & 15), dim=-1).view(c.shape[0], -1).to(torch.bfloat16)
        sz = self.sz if rows is None else self.sz[:, rows]
        scale = sz[..., 0].t().repeat_interleave(self.group, dim=1)
        zero = sz[..., 1].t().repeat_interleave(self.group, dim=1)
        return (q - 8) * scale + zero

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16)
        x2 = x2 if self.perm is None else x2.index_select(1, self.perm)
        if x2.shape[0] <= DENSE_ROWS:
            y = torch._weight_int4pack_mm(x2.contiguous(), self.packed, self.group, self.sz)
            y = y if self.bias is None else y + self.bias
        else:
            y = F.linear(x2, self.dense(), self.bias)
        return y.to(x.dtype).view(*shape[:-1], self.out_features)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 [len(ids), in_features]: an embedding lookup in a tied 4-bit head."""
        if self.perm is not None:
            raise ValueError("an act-order (permuted) weight is not an embedding table")
        return self.dense(ids).float()

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, 4-bit tinygemm, group {self.group}"
