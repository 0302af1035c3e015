"""RopeScaling: how a checkpoint stretches RoPE's positions (engine/layers/rotary.py applies it).

Its own small module, free of torch, so the model config (engine/models/config.py) and the
loaders that fill it name it without importing the layer.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """RoPE position scaling. "linear": positions are divided by `factor` (llama.cpp freq_scale)."""

    type: str
    factor: float
    original_context_length: int | None = None
