"""Round-to-nearest: the per-group quantizer that GPTQ and AWQ also use for every group.

One group of a row holds values w_1..w_G. The range always includes 0 (so a zero weight is exact
and the zero-point is a valid code), as in GPTQ's quant.py (IST-DASLab/gptq, AutoGPTQ):
    lo = min(min w, 0),  hi = max(max w, 0);   lo = hi = 0  ->  lo, hi = -1, +1 (no 0/0)
    asym:  scale = (hi - lo) / maxq,        zero = round(-lo / scale)
    sym:   scale = 2 max(|lo|, hi) / maxq,  zero = (maxq + 1) / 2
    q = clamp(round(w / scale) + zero, 0, maxq),   w ~ scale (q - zero)
The scale is rounded to float16 (what the checkpoints store) before zero and q are computed, so
q is the nearest code for the scale that is actually stored.

One deviation from quant.py: for sym it only mirrors lo = -hi when the group has a negative value,
so a group of non-negative values gets scale hi / maxq and, with zero = 8, loses everything above
7/15 hi. Here sym is always scale = 2 max|w| / maxq (identical whenever a group has a negative).
"""
from __future__ import annotations

import torch

from engine.weights.int_weight import IntWeight

FP16_TINY = 2.0 ** -24  # the smallest positive float16 (subnormal): a scale never rounds to 0
FP16_MAX = 65504.0


def _work_dtype(w: torch.Tensor) -> torch.dtype:
    """float64 stays float64 (tests compare against float64 oracles); everything else is float32."""
    return torch.float64 if w.dtype == torch.float64 else torch.float32


def group_params(w: torch.Tensor, bits: int, sym: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) of each group: w [..., G] -> scale [...] float32 holding float16 values,
    zero [...] float32 holding integers in 0..maxq (float64 for a float64 w)."""
    maxq = 2 ** bits - 1
    w = w.to(_work_dtype(w))
    zeros = torch.zeros((), dtype=w.dtype, device=w.device)
    lo = torch.minimum(w.amin(-1), zeros)
    hi = torch.maximum(w.amax(-1), zeros)
    if sym:
        hi = torch.maximum(-lo, hi)
        lo = -hi
    empty = (lo == 0) & (hi == 0)
    lo = torch.where(empty, -1.0, lo)
    hi = torch.where(empty, 1.0, hi)
    scale = ((hi - lo) / maxq).clamp(FP16_TINY, FP16_MAX).half().to(w.dtype)
    if sym:
        zero = torch.full_like(scale, (maxq + 1) // 2)
    else:
        zero = torch.round(-lo / scale).clamp(0, maxq)
    return scale, zero


def search_group_params(w: torch.Tensor, bits: int, sym: bool, grid: int = 100, max_shrink: float = 0.8,
                        norm: float = 2.4) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) as group_params gives, but of the range shrunk by the factor p in
    1, 1 - 1/grid, ..., 1 - max_shrink that minimises sum |w - scale (q - zero)|^norm over the
    group (GPTQ's quant.py, `mse=True`). Min/max spends codes on the group's one or two largest
    values; clipping them costs their excess and buys a finer step for all the others, and the
    norm above 2 keeps the large values' error weighed more than a plain squared error would."""
    w = w.to(_work_dtype(w))
    scale, zero = group_params(w, bits, sym)
    best = _group_error(w, scale, zero, bits, norm)
    for i in range(1, int(max_shrink * grid) + 1):
        s, z = group_params(w * (1 - i / grid), bits, sym)
        err = _group_error(w, s, z, bits, norm)
        better = err < best
        best = torch.where(better, err, best)
        scale, zero = torch.where(better, s, scale), torch.where(better, z, zero)
    return scale, zero


def _group_error(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int, norm: float) -> torch.Tensor:
    """sum over each group of |w - dequantized|^norm."""
    q = quantize_codes(w, scale[..., None], zero[..., None], bits).to(w.dtype)
    return (w - scale[..., None] * (q - zero[..., None])).abs().pow(norm).sum(-1)


def quantize_codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes clamp(round(w / scale) + zero, 0, maxq); scale and zero broadcast against w
    (give [N, 1] for a group w [N, G], [N] for a column w [N])."""
    return torch.clamp(torch.round(w / scale) + zero, 0, 2 ** bits - 1).to(torch.uint8)


def as_groups(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """[N, K] -> [N, n_groups, G] (G = K for group_size -1); a partial last group is padded with
    zeros, which changes no group's parameters because every range includes 0."""
    N, K = w.shape
    G = K if group_size == -1 else group_size
    pad = -K % G
    if pad:
        w = torch.nn.functional.pad(w, (0, pad))
    return w.reshape(N, -1, G)


def rtn(w: torch.Tensor, bits: int, group_size: int, sym: bool) -> IntWeight:
    """Round each group to its nearest codes: w [N, K] -> IntWeight (group_size -1: one group
    per output channel over all of K)."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be 1..8, got {bits}")
    if group_size != -1 and group_size < 1:
        raise ValueError(f"group_size must be -1 or positive, got {group_size}")
    N, K = w.shape
    wg = as_groups(w.to(_work_dtype(w)), group_size)
    scale, zero = group_params(wg, bits, sym)
    q = quantize_codes(wg, scale[..., None], zero[..., None], bits).reshape(N, -1)[:, :K]
    return IntWeight(bits, group_size, q.contiguous(), scale.float(), zero.to(torch.uint8))
