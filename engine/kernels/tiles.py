"""A QuantWeight (engine/weights/quant_weight.py) cut into the tile layout of the C++ kernels
(engine/kernels/csrc/qlinear.cpp), as a PackedWeight.

8-bit codes that fit in -32..31 (Q6_K's, the Q5 types') are stored in 6 bits, as the file
holds them: decoding reads every weight once per token, so bytes are speed.
"""
from __future__ import annotations

import torch

from engine.weights.packed_weight import PackedWeight
from engine.weights.quant_weight import QuantWeight

TILE = 16  # output columns per tile: one zmm of int32 sums


def _tiles(x: torch.Tensor, n_pad: int) -> torch.Tensor:
    """[N, G...] -> padded [N/16, 16, G...] (zero rows past N)."""
    if n_pad:
        x = torch.cat((x, x.new_zeros(n_pad, *x.shape[1:])))
    return x.view(-1, TILE, *x.shape[1:])


def _scales(s: torch.Tensor | None, n_pad: int, dtype: torch.dtype) -> torch.Tensor | None:
    """[N, K/G] -> [N/16, K/G, 16]: the 16 columns' scales of one group side by side."""
    return None if s is None else _tiles(s.to(dtype), n_pad).transpose(1, 2).contiguous()


def _exact_in_half(s: torch.Tensor | None) -> bool:
    return s is None or torch.equal(s.half().float(), s)


def to_tiles(w: QuantWeight, narrow: bool = True) -> PackedWeight:
    """Interleave a QuantWeight into tiles (see the layout comment in qlinear.cpp); narrow:
    8-bit codes that fit in 6 bits are stored in 6."""
    N, K = w.shape
    if K % 32:
        raise ValueError(f"in_features {K} is not a multiple of 32")
    n_pad = -N % TILE
    if w.bits == 4:
        # k = 32 b + 16 h + 4 g + j  ->  [tile, b, g, column, j] bytes, h = 0 low nibble, 1 high.
        q = _tiles(w.q, n_pad).view(-1, TILE, K // 32, 2, 4, 4).permute(0, 2, 4, 1, 5, 3)
        qw = (q[..., 0] | (q[..., 1] << 4)).contiguous().view(-1, K // 32, 4, 64)
    elif w.bits == 8:
        # k = 4 t + j  ->  [tile, t, column, j]
        qw = _tiles(w.q, n_pad).view(-1, TILE, K // 4, 4).transpose(1, 2).contiguous()
        if narrow and int(w.q.min()) >= -32 and int(w.q.max()) <= 31:  # Q6_K, Q5_x: in 6 bits
            return _pack_scales(w, N, K, n_pad, 6, _six_bits(qw))
    else:
        raise ValueError(f"{w.bits}-bit weights are not supported")
    return _pack_scales(w, N, K, n_pad, w.bits, qw)


def _six_bits(qw8: torch.Tensor) -> torch.Tensor:
    """8-bit tiles [N/16, K/4, 64] of codes in -32..31 -> the 6-bit layout [N/16, K/32, 6, 64]
    (engine/kernels/csrc/qformats.h): u = q + 32; low nibbles of k-groups g and 4 + g in
    vector g, the high 2 bits of k-group 4p + i at bits 2i of vector 4 + p."""
    u = (qw8.view(qw8.shape[0], -1, 8, 64).to(torch.int16) + 32).to(torch.uint8)
    lo = (u[:, :, :4] & 15) | ((u[:, :, 4:] & 15) << 4)
    hi = [sum(((u[:, :, 4 * p + i] >> 4) & 3) << (2 * i) for i in range(4)) for p in range(2)]
    return torch.cat((lo, torch.stack(hi, dim=2).to(torch.uint8)), dim=2).contiguous()


def _pack_scales(w: QuantWeight, N: int, K: int, n_pad: int, bits: int, qw: torch.Tensor) -> PackedWeight:
    if w.sup is not None and K % 256 == 0:  # K-quants: float16 per 256 and an 8-bit code per group
        s = w.sup
        return PackedWeight(bits, w.group, N, K, qw, _scales(s.d_code, n_pad, torch.int8),
                            _scales(s.m_code, n_pad, torch.int8), _scales(s.d, n_pad, torch.float16),
                            _scales(s.m, n_pad, torch.float16))
    # Legacy GGUF scales are float16 already: kept so, they cost a quarter of the 4-bit bytes
    # instead of half; other float32 scales stay float32.
    dtype = torch.float16 if _exact_in_half(w.d) and _exact_in_half(w.m) else torch.float32
    return PackedWeight(bits, w.group, N, K, qw, _scales(w.d, n_pad, dtype), _scales(w.m, n_pad, dtype))
