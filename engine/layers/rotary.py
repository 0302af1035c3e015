"""Rotary position embedding (RoPE), rotate-half form, with base and position scaling.

For head dim d and i < d/2 the pair (x_i, x_{i+d/2}) is rotated by the angle
    theta_i(p) = (p / linear_factor) * base^(-2i/d) / freq_factor_i
(freq_factor_i = 1 unless a llama3 `rope_freqs` tensor gives them). rotate-half pairs element i
with i + d/2 (HF/NEOX layout). GGUF llama-family files store Q/K rows permuted for interleaved
pairs (2i, 2i+1); the loader un-permutes them, so this is the only RoPE the model needs.
"""
from __future__ import annotations

import torch

from engine.models.config import RopeScaling


def rope_inv_freq(head_dim: int, base: float, freq_factors: torch.Tensor | None = None) -> torch.Tensor:
    """[d/2] float32: base^(-2i/d), divided by the llama3 frequency factors when present."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    inv_freq = base ** -exponent
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.to(torch.float64).cpu()
    return inv_freq.float()


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
                 freq_factors: torch.Tensor | None = None) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head dim, got {head_dim}")
        if scaling is not None and scaling.type != "linear":
            raise ValueError(f"unsupported RoPE scaling {scaling.type!r} (supported: none, linear)")
        self.scaling = scaling
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, base, freq_factors), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] -> rotation tables (C, S) [T, 1, d] for `apply_rope`."""
        return rotation_tables(*rope_cos_sin(positions, self.inv_freq, self.scaling))
