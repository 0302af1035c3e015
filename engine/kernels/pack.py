"""Integer weights with group scales (`QuantWeight`) and their tile layout for the C++ kernels.

A QuantWeight is the exact content of a quantized matrix [N, K]: integer codes q, one scale d
per group of G input values and an optional min m, so that  w[n, k] = d[n, k // G] q[n, k] + m.
The GGUF repacks (engine/loaders/repack.py) produce it; rows can be concatenated (fused qkv,
gate_up) and permuted (RoPE rows) before it is packed, exactly as a dense weight would be.

Formats (the ones engine/kernels/csrc/qlinear.cpp runs):
  bits 4, G 32: q uint8 in 0..15, m present        (Q4_0 with m = -8d, Q4_1, Q4_K)
  bits 8, G 32: q int8, m optional                (Q8_0, Q5_0, Q5_1, Q5_K)
  bits 8, G 16: q int8, m optional                (Q6_K: d = super-scale * 8-bit sub-scale)
8-bit codes that fit in -32..31 (Q6_K's, the Q5 types') are packed in 6 bits, as the file
holds them: decoding reads every weight once per token, so bytes are speed.
A 4-bit weight widens to 8 bits and G 32 splits into G 16 exactly (`widen`), so mixed files
(Q4_K q/k with a Q6_K v) still fuse into one matrix.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

TILE = 16  # output columns per tile: one zmm of int32 sums


@dataclass(frozen=True, slots=True)
class SuperScales:
    """K-quant scales as the file factors them: d = d_super[g // per] * d_code[g] (and the mins
    alike), float16 super-block scales per 256 values and 6/8-bit codes per group; one float32
    product, so exactly QuantWeight.d. Kept to pack 8.6 or 4.75 bits a weight, not 10 or 6."""

    d: torch.Tensor  # float32 (float16 values) [N, K // 256]
    d_code: torch.Tensor  # int8 [N, K // group]
    m: torch.Tensor | None = None
    m_code: torch.Tensor | None = None

    def rows(self, index: torch.Tensor) -> SuperScales:
        return SuperScales(*(None if t is None else t[index] for t in (self.d, self.d_code, self.m, self.m_code)))

    def to(self, device: torch.device | str) -> SuperScales:
        return SuperScales(*(None if t is None else t.to(device) for t in (self.d, self.d_code, self.m, self.m_code)))


@dataclass(frozen=True, slots=True)
class QuantWeight:
    bits: int
    group: int
    q: torch.Tensor  # [N, K] uint8 (4-bit codes) or int8
    d: torch.Tensor  # float32 [N, K // group]
    m: torch.Tensor | None  # float32 [N, K // group] or None
    sup: SuperScales | None = None  # the same d (and m) factored, for K-quants
    # Act-order GPTQ: column j here is input column perm[j] (the layer multiplies x[:, perm]),
    # which makes the checkpoint's scattered groups contiguous.
    perm: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K] in the input's column order: d q + m, one float32 multiply (and add) per weight."""
        d = self.d.repeat_interleave(self.group, dim=1)
        w = self.q.float() * d
        w = w if self.m is None else w + self.m.repeat_interleave(self.group, dim=1)
        if self.perm is not None:  # back to the input's own column order
            w = torch.empty_like(w).index_copy_(1, self.perm, w)
        return w

    def to(self, device: torch.device | str) -> QuantWeight:
        """The same weight on `device` (a GPU's layers take it from there: engine/layers/linear.py)."""
        return QuantWeight(self.bits, self.group, self.q.to(device), self.d.to(device),
                           None if self.m is None else self.m.to(device),
                           None if self.sup is None else self.sup.to(device),
                           None if self.perm is None else self.perm.to(device))

    def rows(self, index: torch.Tensor) -> QuantWeight:
        return QuantWeight(self.bits, self.group, self.q[index], self.d[index],
                           None if self.m is None else self.m[index],
                           None if self.sup is None else self.sup.rows(index), self.perm)


def widen(w: QuantWeight, bits: int, group: int, with_min: bool) -> QuantWeight:
    """The same weights in a wider format (more bits, smaller group, a zero min): exact."""
    q = w.q.to(torch.int8) if bits == 8 and w.bits == 4 else w.q
    d, m, sup = w.d, w.m, w.sup
    if group != w.group:
        d = d.repeat_interleave(w.group // group, dim=1)
        m = None if m is None else m.repeat_interleave(w.group // group, dim=1)
        if sup is not None:  # the super-block scales stay; each code covers both halves
            sup = SuperScales(sup.d, sup.d_code.repeat_interleave(w.group // group, dim=1), sup.m,
                              None if sup.m_code is None else sup.m_code.repeat_interleave(w.group // group, dim=1))
    if with_min and m is None:
        m = torch.zeros_like(d)
        if sup is not None:  # a zero min is 0 * 0
            sup = SuperScales(sup.d, sup.d_code, torch.zeros_like(sup.d), torch.zeros_like(sup.d_code))
    return QuantWeight(bits, group, q, d, m, sup, w.perm)


def cat_rows(parts: list[QuantWeight]) -> QuantWeight:
    """Row-concatenation [w0; w1; ...], in the narrowest format that holds every part (which
    must agree on the column order: see `same_columns`)."""
    if not same_columns(parts):
        raise ValueError("cannot fuse weights whose input columns are permuted differently")
    bits = max(p.bits for p in parts)
    group = min(p.group for p in parts)
    with_min = any(p.m is not None for p in parts)
    parts = [widen(p, bits, group, with_min) for p in parts]
    m = torch.cat([p.m for p in parts]) if with_min else None
    sup = None
    if all(p.sup is not None for p in parts):
        sup = SuperScales(*(torch.cat([getattr(p.sup, f) for p in parts]) if with_min or f[0] == "d" else None
                            for f in ("d", "d_code", "m", "m_code")))
    return QuantWeight(bits, group, torch.cat([p.q for p in parts]), torch.cat([p.d for p in parts]), m, sup,
                       parts[0].perm)


def same_columns(parts: list[QuantWeight]) -> bool:
    """Whether the parts read their inputs in one order (act-order GPTQ permutes them per layer)."""
    first = parts[0].perm
    return all(p.perm is None if first is None else p.perm is not None and torch.equal(p.perm, first)
               for p in parts)


@dataclass(frozen=True, slots=True)
class PackedWeight:
    """A QuantWeight in qlinear.cpp's tile layout, columns padded to a multiple of TILE."""

    bits: int
    group: int
    out_features: int
    in_features: int
    qw: torch.Tensor  # uint8/int8 tiles
    d: torch.Tensor  # float16 or float32 [N/16, K/G, 16]; int8 codes with d_super
    m: torch.Tensor | None
    d_super: torch.Tensor | None = None  # float16 [N/16, K/256, 16]
    m_super: torch.Tensor | None = None

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qw, self.d, self.m, self.d_super, self.m_super)
                   if t is not None)


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


def pack(w: QuantWeight, narrow: bool = True) -> PackedWeight:
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
