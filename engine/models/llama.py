"""The Llama-family decoder (llama, smollm, mistral, qwen2): pre-norm, GQA attention, SwiGLU.

    h = embed(ids)
    for each layer:  h = h + o_proj(attn(rope(q), rope(k), v))   on rms_norm(h)
                     h = h + down(silu(gate(x)) * up(x))          on x = rms_norm(h)
    hidden = rms_norm(h);  logits = hidden @ lm_head^T  (lm_head = embed when tied)

q/k/v and gate/up are fused into one Linear each (one GEMM instead of three/two). The residual
stream is kept in float32 whatever the weight dtype. Attention goes through PagedAttention, so
the KV pool layout and batching live in engine/layers/attention.py, not here.

Weights are passed in by name (see `WEIGHT_NAMES`), dense or as exact QuantWeights (4/8-bit
codes with group scales), already un-permuted and fused by the loader; the model never sees a
file format.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from engine.kernels.pack import QuantWeight
from engine.layers.activation import silu_and_mul
from engine.layers.attention import AttentionMetadata, PagedAttention
from engine.layers.decoder_stack import build_stack, run_stack
from engine.layers.linear import make_linear
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding, apply_rope
from engine.models.config import ModelConfig

Take = Callable[[str], "torch.Tensor | QuantWeight | None"]  # weight name -> weight (None if absent)

# Our parameter names; "{i}" is the layer index. Biases exist only when config.attention_bias.
WEIGHT_NAMES = (
    "embed_tokens.weight", "norm.weight", "lm_head.weight", "rope_freqs",
    "layers.{i}.input_layernorm.weight", "layers.{i}.post_attention_layernorm.weight",
    "layers.{i}.qkv_proj.weight", "layers.{i}.qkv_proj.bias", "layers.{i}.o_proj.weight",
    "layers.{i}.gate_up_proj.weight", "layers.{i}.down_proj.weight",
)


def _norm(config: ModelConfig, weight: torch.Tensor) -> RMSNorm:
    norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
    norm.weight = torch.nn.Parameter(weight, requires_grad=False)
    return norm


class LlamaAttention(torch.nn.Module):
    def __init__(self, config: ModelConfig, prefix: str, take: Take) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.qkv_proj = make_linear(take(prefix + "qkv_proj.weight"), take(prefix + "qkv_proj.bias"))
        self.o_proj = make_linear(take(prefix + "o_proj.weight"))
        self.attn = PagedAttention(config.num_heads, config.num_kv_heads, config.head_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        T, qk_size = x.shape[0], self.q_size + self.kv_size
        qkv = self.qkv_proj(x)
        # Q and K heads share positions, so one RoPE call rotates both: [T, H + n_kv, hd].
        qk = apply_rope(qkv[:, :qk_size].view(T, self.num_heads + self.num_kv_heads, self.head_dim), cos, sin)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, qk_size:].view(T, self.num_kv_heads, self.head_dim)
        o = self.attn(q, k, v, kv_cache, meta)
        return self.o_proj(o.reshape(T, self.q_size))


class LlamaMLP(torch.nn.Module):
    def __init__(self, prefix: str, take: Take) -> None:
        super().__init__()
        self.gate_up_proj = make_linear(take(prefix + "gate_up_proj.weight"))
        self.down_proj = make_linear(take(prefix + "down_proj.weight"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, config: ModelConfig, i: int, take: Take) -> None:
        super().__init__()
        p = f"layers.{i}."
        self.input_layernorm = _norm(config, take(p + "input_layernorm.weight"))
        self.self_attn = LlamaAttention(config, p, take)
        self.post_attention_layernorm = _norm(config, take(p + "post_attention_layernorm.weight"))
        self.mlp = LlamaMLP(p, take)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                sin: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        # residual carries the float32 stream; `hidden` is the last sub-block's output to add.
        if residual is None:
            residual = hidden.float()
            x = self.input_layernorm(residual)
        else:
            x, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(x, cos, sin, kv_cache, meta)
        x, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(torch.nn.Module):
    """forward(input_ids [T], positions [T], kv_caches, meta) -> hidden [T, d] (float32)."""

    def __init__(self, config: ModelConfig, take: Take, dtype: torch.dtype) -> None:
        super().__init__()
        self.config, self._dtype = config, dtype
        table = take("embed_tokens.weight")
        head = table if config.tie_word_embeddings else take("lm_head.weight")
        if isinstance(table, QuantWeight):
            # A quantized table is looked up through a QuantLinear's rows (the tied head itself,
            # or a packing of its own): the codes stay at the file's size.
            self.lm_head = make_linear(head)
            self.embed_tokens = None
            self._table = self.lm_head if config.tie_word_embeddings else make_linear(table)
        else:
            self.embed_tokens = torch.nn.Parameter(table, requires_grad=False)
            # Tied heads share the table when the head stays dense; a packed head is a second
            # copy of it (the lookup needs the plain rows), the price of the faster GEMM.
            self.lm_head = make_linear(self.embed_tokens if config.tie_word_embeddings else head)
            self._table = None
        self.norm = _norm(config, take("norm.weight"))
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling,
                                      take("rope_freqs") if config.rope_freq_factors else None
                                      ).to(self.device)
        self.layers = torch.nn.ModuleList(LlamaDecoderLayer(config, i, take) for i in range(config.num_layers))
        self.stack = build_stack(self)  # all matrices quantized: the layers run as one C++ op

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of activations, KV and the dense weights (quantized ones have their own)."""
        return self._dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self._table is not None:
            return self._table.rows(input_ids).to(self._dtype)
        return F.embedding(input_ids, self.embed_tokens)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata) -> torch.Tensor:
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"{len(kv_caches)} KV caches for {len(self.layers)} layers")
        hidden = self.embed(input_ids)
        cos, sin = self.rotary(positions)
        if self.stack is not None:
            return run_stack(self.stack, hidden, (cos, sin), kv_caches, meta)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden, residual = layer(hidden, residual, cos, sin, kv_cache, meta)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, d] -> float32 logits [N, vocab] (matmul in the weight dtype)."""
        return self.lm_head(hidden).float()
