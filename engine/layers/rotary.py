"""Rotary position embedding (RoPE), rotate-half form, with base and position scaling.

For head dim d and i < d/2 the pair (x_i, x_{i+d/2}) is rotated by the angle
    theta_i(p) = (p / linear_factor) * base^(-2i/d) / freq_factor_i
(freq_factor_i = 1 unless a llama3 `rope_freqs` tensor gives them). rotate-half pairs element i
with i + d/2 (HF/NEOX layout). GGUF llama-family files store Q/K rows permuted for interleaved
pairs (2i, 2i+1); the loader un-permutes them, so this is the only RoPE the model needs.

Partial rotary (Phi-4-mini: the first n of d dims turn, pairs (i, i + n/2)): the loader moves
each head's dims so the turning pairs sit at (i, i + d/2) for i < n/2 and the others fill the
remaining slots; a slot i >= n/2 then turns by angle 0 (cos 1, sin 0). Moving the same dims
of q and k leaves every q.k as it was. LongRoPE (Phi's 128k models): per-frequency divisors,
the short set while the context is within the original one, else the long set (as llama.cpp
picks them by its context size), and cos and sin of the turning pairs times attn_factor.
"""
from __future__ import annotations

import torch

from engine.layers.rope_scaling import RopeScaling


def rope_inv_freq(head_dim: int, base: float, freq_factors: torch.Tensor | None = None,
                  rotary_dim: int = 0) -> torch.Tensor:
    """[d/2] float32: base^(-2i/n) for the n = rotary_dim turning dims (divided by the llama3 or
    LongRoPE frequency factors when present), then 0 for the pairs that do not turn."""
    n = rotary_dim or head_dim
    inv_freq = base ** -(torch.arange(0, n, 2, dtype=torch.float64) / n)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.to(torch.float64).cpu()
    return torch.cat((inv_freq, torch.zeros((head_dim - n) // 2, dtype=torch.float64))).float()


def partial_rotary_order(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """[d] long: new dim j of a head takes old dim order[j], so the n = rotary_dim turning dims'
    pairs (i, i + n/2) land on (i, i + d/2) and the d - n others fill slots n/2 .. d/2 - 1 and
    d/2 + n/2 .. d - 1 (each half of them in order)."""
    n, h = rotary_dim, (head_dim - rotary_dim) // 2
    return torch.cat((torch.arange(0, n // 2), torch.arange(n, n + h),
                      torch.arange(n // 2, n), torch.arange(n + h, head_dim)))


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor,
                 scaling: RopeScaling | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T] -> (cos, sin) [T, d/2] float32 for those absolute positions."""
    pos = positions.to(torch.float32)
    if scaling is not None and scaling.type == "linear":
        pos = pos / scaling.factor
    angles = pos[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def rotation_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [T, d/2] -> (C, S) [T, 1, d] with C = [cos | cos], S = [-sin | sin], so that
    apply_rope is two products and a sum (built once a step, shared by every layer and head)."""
    return torch.cat((cos, cos), -1)[:, None, :], torch.cat((-sin, sin), -1)[:, None, :]


def apply_rope(x: torch.Tensor, C: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """x [T, H, d] -> rotated x, in float32.

    With x = [x1 | x2], the rotation (x1 cos - x2 sin, x2 cos + x1 sin) equals
    x * [cos | cos] + [x2 | x1] * [-sin | sin], and [x2 | x1] is x rolled by d/2: four ops
    instead of chunk, four products, a sum, a difference and a concatenation. Negating sin is
    exact, so the result has the same bits as the two-half form."""
    xf = x.float()
    return (xf * C + xf.roll(x.shape[-1] // 2, -1) * S).to(x.dtype)


class RotaryEmbedding(torch.nn.Module):
    """Holds the inverse frequencies; `forward(positions)` gives (cos, sin) for a whole step."""

    def __init__(self, head_dim: int, base: float, scaling: RopeScaling | None = None,
                 freq_factors: torch.Tensor | None = None, rotary_dim: int = 0, attn_factor: float = 1.0,
                 long_factors: torch.Tensor | None = None, original_context: int = 0) -> None:
        super().__init__()
        if head_dim % 2 or (head_dim - (rotary_dim or head_dim)) % 2:
            raise ValueError(f"RoPE needs an even head dim and rotary dim, got {head_dim}, {rotary_dim}")
        if scaling is not None and scaling.type != "linear":
            raise ValueError(f"unsupported RoPE scaling {scaling.type!r} (supported: none, linear)")
        self.scaling = scaling
        self.original_context = original_context
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, base, freq_factors, rotary_dim), persistent=False)
        self.inv_freq_short = self.inv_freq
        self.inv_freq_long = (rope_inv_freq(head_dim, base, long_factors, rotary_dim)
                              if long_factors is not None else None)
        n = (rotary_dim or head_dim) // 2
        self.mscale = (torch.cat((torch.full((n,), attn_factor), torch.ones(head_dim // 2 - n)))
                       if attn_factor != 1.0 else None)

    def use_context(self, context: int) -> None:
        """LongRoPE: the long factors for a context beyond the original one, else the short."""
        if self.inv_freq_long is not None:
            self.inv_freq = self.inv_freq_long if context > self.original_context else self.inv_freq_short

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] -> rotation tables (C, S) [T, 1, d] for `apply_rope`."""
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.scaling)
        if self.mscale is not None:  # ggml's attn_factor, on the turning pairs only
            m = self.mscale.to(cos.device)
            cos, sin = cos * m, sin * m
        return rotation_tables(cos, sin)
