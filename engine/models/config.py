"""What a Llama-family checkpoint is: the shapes and constants the model code needs.

Filled from a file's metadata (engine/loaders/gguf_loader.py), never from its name.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.model_files.fit import kv_bytes_per_token


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """RoPE position scaling. "linear": positions are divided by `factor` (llama.cpp freq_scale)."""

    type: str
    factor: float
    original_context_length: int | None = None


@dataclass(frozen=True, slots=True)
class ModelConfig:
    arch: str  # GGUF general.architecture: "llama" (also smollm, mistral files) or "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    context_length: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry biases (qwen2)
    rope_freq_factors: bool = False  # a llama3-style `rope_freqs` tensor divides the frequencies

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, itemsize: int) -> int:
        """K and V for one token across all layers (the fit rule's arithmetic)."""
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, itemsize)
