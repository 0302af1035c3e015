"""Llama 3.x RoPE scaling both ways: Hugging Face's rope_scaling {"rope_type": "llama3", factor,
low_freq_factor, high_freq_factor, original_max_position_embeddings} <-> the per-frequency divisors
llama.cpp's converter stores as the GGUF's `rope_freqs` tensor.

With L the original context, lo/hi the two factors and wavelength w_i = 2 pi / base^(-2i/d), the
divisor of pair i is 1 where w_i < L/hi (fast pairs untouched), `factor` where w_i > L/lo, and
between them 1 / ((1 - s) / factor + s) with s = (L / w_i - lo) / (hi - lo) (transformers'
_compute_llama3_parameters, convert_hf_to_gguf.py's LlamaModel). The tensor fixes the factor (its
largest value) and the edges only as ratios to L (scaling L, lo and hi together changes nothing),
so it is read back at Meta's L = 8192 with the edges scaled to it, and the numbers are kept only
if they regenerate the tensor within float32 rounding.
"""
from __future__ import annotations

import math

import torch

ORIGINAL_CONTEXT = 8192  # every Llama 3.x's original_max_position_embeddings


def wavelengths(head_dim: int, base: float) -> torch.Tensor:
    """[d/2] float64: each rotation pair's wavelength in positions, from float32 frequencies as
    the converter computes them."""
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    return 2 * math.pi / freqs.double()


def llama3_factors(head_dim: int, base: float, factor: float, low_freq_factor: float,
                   high_freq_factor: float, original_max_position_embeddings: int) -> torch.Tensor:
    """[d/2] float32: the divisors of RoPE's frequencies (the GGUF's rope_freqs)."""
    w, L = wavelengths(head_dim, base), original_max_position_embeddings
    s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor)
    out = 1 / ((1 - s) / factor + s)
    out = torch.where(w < L / high_freq_factor, torch.ones_like(w), out)
    return torch.where(w > L / low_freq_factor, torch.full_like(w, factor), out).float()


def _edges(r: torch.Tensor, w: torch.Tensor, factor: float) -> tuple[float, float]:
    """(lo, hi) at L = ORIGINAL_CONTEXT: a line through the smoothed pairs' s when two or more
    are smoothed, else the edges halfway (in log wavelength) between the pairs that bracket them."""
    L, mid = ORIGINAL_CONTEXT, (r != 1) & (r != factor)
    if int(mid.sum()) >= 2:
        s = (1 / r[mid].double() - 1 / factor) / (1 - 1 / factor)
        u = L / w[mid]
        slope = float((s[-1] - s[0]) / (u[-1] - u[0]))
        lo = float(u[0] - s[0] / slope)
        return lo, lo + 1 / slope
    last_one = int((r == 1).nonzero().max()) if bool((r == 1).any()) else -1
    first_factor = int((r == factor).nonzero().min())
    hi_w = math.sqrt(float(w[last_one]) * float(w[last_one + 1])) if last_one >= 0 else float(w[0]) / 2
    lo_w = math.sqrt(float(w[first_factor - 1]) * float(w[first_factor])) if first_factor > 0 else float(w[0]) / 2
    lo = L / lo_w
    if bool(mid.any()):  # one smoothed pair: the high edge through its s
        s = (1 / float(r[mid][0]) - 1 / factor) / (1 - 1 / factor)
        return lo, lo + (L / float(w[mid][0]) - lo) / s
    return lo, L / hi_w


def llama3_params(rope_freqs: torch.Tensor, head_dim: int, base: float) -> dict:
    """rope_freqs [d/2] -> Hugging Face's llama3 rope_scaling; ValueError, in words, when no
    llama3 parameters regenerate the tensor (it was made some other way)."""
    r = rope_freqs.float().cpu()
    factor = float(r.max())
    w = wavelengths(head_dim, base)
    order = torch.where(r == 1, 0, torch.where(r == factor, 2, 1))
    if factor <= 1 or not bool((order[1:] >= order[:-1]).all()) or not bool((r >= 1).all()):
        raise ValueError("rope_freqs is not llama3 RoPE scaling (divisors 1 on the fast pairs, rising to "
                         "the largest on the slow ones)")
    lo, hi = _edges(r, w, factor)
    for lo_, hi_ in ((float(f"{lo:.4g}"), float(f"{hi:.4g}")), (lo, hi)):  # Meta's round 1 and 4 first
        params = {"factor": factor, "low_freq_factor": lo_, "high_freq_factor": hi_,
                  "original_max_position_embeddings": ORIGINAL_CONTEXT}
        if 0 < lo_ < hi_ and torch.allclose(llama3_factors(head_dim, base, **params), r, rtol=5e-7, atol=0):
            return params
    raise ValueError(f"rope_freqs is not reproduced by llama3 RoPE scaling (factor {factor:g}, edges "
                     f"{lo:.6g} and {hi:.6g} at an original context of {ORIGINAL_CONTEXT})")
