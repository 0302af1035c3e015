"""PackedWeight: a QuantWeight cut into qlinear.cpp's tiles (engine/kernels/tiles.py makes it)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


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
