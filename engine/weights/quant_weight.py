"""QuantWeight: the exact content of a quantized matrix [N, K] as the kernels take it: integer
codes q, one scale d per group of G input values and an optional min m, so that
    w[n, k] = d[n, k // G] q[n, k] + m.
The GGUF block readers (engine/loaders/gguf_blocks.py) and IntWeight.to_quant_weight produce it;
rows can be concatenated (fused qkv, gate_up) and permuted (RoPE rows) before it is cut into the
kernels' tiles (engine/kernels/tiles.py), exactly as a dense weight would be.

Formats (the ones engine/kernels/csrc/qlinear.cpp runs):
  bits 4, G 32: q uint8 in 0..15, m present        (Q4_0 with m = -8d, Q4_1, Q4_K)
  bits 8, G 32: q int8, m optional                (Q8_0, Q5_0, Q5_1, Q5_K)
  bits 8, G 16: q int8, m optional                (Q6_K: d = super-scale * 8-bit sub-scale)
A 4-bit weight widens to 8 bits and G 32 splits into G 16 exactly (`widen`), so mixed files
(Q4_K q/k with a Q6_K v) still fuse into one matrix.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


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
