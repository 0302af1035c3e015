"""What a decoder checkpoint is: the shapes and constants the model code needs.

Filled from a file's metadata and its family's description (engine/model_files/families.py),
never from its name. The config holds the family itself: its switches are read there
(config.family.qk_norm), never copied. The per-layer tuples say which attention each layer runs.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from engine.layers.rope_scaling import RopeScaling
from engine.model_files.families import Family
from engine.model_files.footprint import kv_bytes_per_token


@dataclass(frozen=True, slots=True)
class ModelConfig:
    family: Family  # engine/model_files/families.FAMILIES' entry
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
    attention_scale: float | None = None  # softmax(q.k * scale); None: head_dim^-0.5
    rope_theta_local: float | None = None  # RoPE base of layers whose layer_rope is 1 (no scaling)
    layer_windows: tuple[int, ...] = ()  # per layer: sliding window in tokens, 0 = full; () = all full
    layer_rope: tuple[int, ...] = ()  # per layer: 0 the global RoPE, 1 the local one, -1 none; () = all 0
    rotary_dim: int = 0  # dims of each head RoPE turns (0: all; fewer: the loader moved them, rotary.py)
    rope_attn_factor: float = 1.0  # cos and sin of the turning pairs times this (LongRoPE's mscale)
    rope_long_factors: bool = False  # LongRoPE: rope_factors_short/long, chosen by the context
    rope_original_context: int = 0  # LongRoPE: the context the short factors serve
    num_experts: int = 0  # a mixture of experts (family.moe): experts per layer; 0: a dense MLP
    num_experts_used: int = 0  # experts each token takes
    expert_intermediate_size: int = 0  # each expert's gate/up rows
    shared_expert_intermediate_size: int = 0  # the shared expert's (family.moe.shared_expert); 0: none

    @property
    def arch(self) -> str:
        """GGUF general.architecture: the family's name."""
        return self.family.name

    @property
    def embed_scale(self) -> float:
        """Embeddings are multiplied by it: sqrt(hidden) as a float32, as ggml's sqrtf (Gemma), else 1."""
        if not self.family.embed_scale_sqrt_hidden:
            return 1.0
        return struct.unpack("f", struct.pack("f", math.sqrt(self.hidden_size)))[0]

    @property
    def scale(self) -> float:
        return self.attention_scale if self.attention_scale is not None else self.head_dim ** -0.5

    def window(self, layer: int) -> int:
        return self.layer_windows[layer] if self.layer_windows else 0

    def rope(self, layer: int) -> int:
        return self.layer_rope[layer] if self.layer_rope else 0

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, itemsize: int) -> int:
        """K and V for one token across all layers (the fit rule's arithmetic)."""
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, itemsize)
