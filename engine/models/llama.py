"""The dense decoder of every family Ember runs (engine/model_files/families.py): the Llama
block, with each family's differences read from its ModelConfig rather than written as a class.

    h = embed(ids) * embed_scale
    for each layer:  a = o_proj(attn(rope(qn(q)), rope(kn(k)), v, window))   on rms_norm(h)
                     h = h + post_attn_norm(a)
                     m = down(act(gate(x)) * up(x))                           on x = rms_norm(h)
                         (a mixture of experts: its top-k experts' m, weighed; engine/layers/moe.py)
                     h = h + post_mlp_norm(m)
    hidden = rms_norm(h);  logits = hidden @ lm_head^T  (lm_head = embed when tied)

qn/kn (per-head RMSNorm), the post norms, the window and a layer's RoPE (global, local or none)
are there only where the config says so; act is SiLU or GELU-tanh.

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

from engine.layers.activation import ACTIVATIONS
from engine.layers.attention import AttentionMetadata, PagedAttention
from engine.layers.decoder_stack import build_stack, run_stack
from engine.layers.make_linear import make_linear
from engine.layers.moe import MoE
from engine.layers.norm import RMSNorm, rms_norm
from engine.layers.rotary import RotaryEmbedding, apply_rope
from engine.models.config import ModelConfig
from engine.weight_arena import move_to_huge_pages
from engine.weights.quant_weight import QuantWeight

Take = Callable[[str], "torch.Tensor | QuantWeight | None"]  # weight name -> weight (None if absent)

# Our parameter names; "{i}" is the layer index, "{e}" an expert's (a mixture of experts' layers
# have a router and experts instead of gate_up_proj and down_proj, and a shared expert where the
# family's Routing says). Biases exist only when config.attention_bias,
# q/k norms only with the family's qk_norm, the output norms only with its post_norms.
WEIGHT_NAMES = (
    "embed_tokens.weight", "norm.weight", "lm_head.weight", "rope_freqs", "rope_factors_short", "rope_factors_long",
    "layers.{i}.input_layernorm.weight", "layers.{i}.post_attention_layernorm.weight",
    "layers.{i}.qkv_proj.weight", "layers.{i}.qkv_proj.bias", "layers.{i}.o_proj.weight",
    "layers.{i}.gate_up_proj.weight", "layers.{i}.down_proj.weight",
    "layers.{i}.q_norm.weight", "layers.{i}.k_norm.weight",
    "layers.{i}.attn_output_norm.weight", "layers.{i}.mlp_output_norm.weight",
    "layers.{i}.router.weight", "layers.{i}.experts.{e}.gate_up_proj.weight", "layers.{i}.experts.{e}.down_proj.weight",
    "layers.{i}.shared_expert.gate_up_proj.weight", "layers.{i}.shared_expert.down_proj.weight",
    "layers.{i}.shared_expert_gate.weight",
)

Rotation = "tuple[torch.Tensor, torch.Tensor] | None"  # (C, S) tables of apply_rope; None: no RoPE


def global_rotary(config: ModelConfig, take: Take) -> RotaryEmbedding:
    """The RoPE of the config's global layers, its frequency factors (llama3's rope_freqs,
    LongRoPE's short and long sets) by name from `take`; the calibration forward builds the same."""
    long = config.rope_long_factors
    return RotaryEmbedding(
        config.head_dim, config.rope_theta, config.rope_scaling,
        take("rope_factors_short") if long else take("rope_freqs") if config.rope_freq_factors else None,
        config.rotary_dim, config.rope_attn_factor, take("rope_factors_long") if long else None,
        config.rope_original_context)


def _norm(config: ModelConfig, weight: torch.Tensor) -> RMSNorm:
    norm = RMSNorm(weight.shape[0], config.rms_norm_eps)
    norm.weight = torch.nn.Parameter(weight, requires_grad=False)
    return norm


class LlamaAttention(torch.nn.Module):
    def __init__(self, config: ModelConfig, prefix: str, take: Take, window: int = 0) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_size, self.kv_size, self.eps = config.q_size, config.kv_size, config.rms_norm_eps
        self.qkv_proj = make_linear(take(prefix + "qkv_proj.weight"), take(prefix + "qkv_proj.bias"))
        self.o_proj = make_linear(take(prefix + "o_proj.weight"))
        self.q_norm = _norm(config, take(prefix + "q_norm.weight")) if config.family.qk_norm else None
        self.k_norm = _norm(config, take(prefix + "k_norm.weight")) if config.family.qk_norm else None
        self.attn = PagedAttention(config.num_heads, config.num_kv_heads, config.head_dim, config.scale, window)

    def forward(self, x: torch.Tensor, rotation: Rotation,
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        T, qk_size = x.shape[0], self.q_size + self.kv_size
        qkv = self.qkv_proj(x)
        qk = qkv[:, :qk_size].view(T, self.num_heads + self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # per-head norms, each over head_dim, before RoPE
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
            qk = torch.cat((rms_norm(q, self.q_norm.weight, self.eps), rms_norm(k, self.k_norm.weight, self.eps)), 1)
        # Q and K heads share positions, so one RoPE call rotates both: [T, H + n_kv, hd].
        if rotation is not None:
            qk = apply_rope(qk, *rotation)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, qk_size:].view(T, self.num_kv_heads, self.head_dim)
        o = self.attn(q, k, v, kv_cache, meta)
        return self.o_proj(o.reshape(T, self.q_size))


class LlamaMLP(torch.nn.Module):
    def __init__(self, prefix: str, take: Take, activation: str = "silu") -> None:
        super().__init__()
        self.gate_up_proj = make_linear(take(prefix + "gate_up_proj.weight"))
        self.down_proj = make_linear(take(prefix + "down_proj.weight"))
        self.act = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, config: ModelConfig, i: int, take: Take) -> None:
        super().__init__()
        p = f"layers.{i}."
        self.rope = config.rope(i)  # which of the step's rotations it takes (-1: none)
        self.input_layernorm = _norm(config, take(p + "input_layernorm.weight"))
        self.self_attn = LlamaAttention(config, p, take, config.window(i))
        self.post_attention_layernorm = _norm(config, take(p + "post_attention_layernorm.weight"))
        act = config.family.activation
        self.mlp = MoE(config, p, take, act) if config.family.moe else LlamaMLP(p, take, act)
        self.attn_output_norm = self.mlp_output_norm = None
        if config.family.post_norms:
            self.attn_output_norm = _norm(config, take(p + "attn_output_norm.weight"))
            self.mlp_output_norm = _norm(config, take(p + "mlp_output_norm.weight"))

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None, rotation: Rotation,
                kv_cache: tuple[torch.Tensor, torch.Tensor],
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        # residual carries the float32 stream; `hidden` is the last sub-block's output to add.
        if residual is None:
            residual = hidden.float()
            x = self.input_layernorm(residual)
        else:
            x, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(x, rotation, kv_cache, meta)
        if self.attn_output_norm is not None:
            hidden = self.attn_output_norm(hidden.float())
        x, residual = self.post_attention_layernorm(hidden, residual)
        hidden = self.mlp(x)
        if self.mlp_output_norm is not None:
            hidden = self.mlp_output_norm(hidden.float())
        return hidden, residual


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
        self.rotary = global_rotary(config, take).to(self.device)
        # Sliding-window layers of some families turn at their own base, unscaled (gemma3).
        self.rotary_local = (RotaryEmbedding(config.head_dim, config.rope_theta_local).to(self.device)
                             if config.rope_theta_local is not None else None)
        self.layers = torch.nn.ModuleList(LlamaDecoderLayer(config, i, take) for i in range(config.num_layers))
        move_to_huge_pages(self)  # before the stack takes references: one copy, in 2 MiB pages
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
            rows = self._table.rows(input_ids)
        else:
            rows = F.embedding(input_ids, self.embed_tokens)
        if self.config.embed_scale != 1.0:  # in float32, as llama.cpp's ggml_scale
            rows = rows.float() * self.config.embed_scale
        return rows.to(self._dtype)

    def use_context(self, context: int) -> None:
        """The runner's context per sequence, which picks LongRoPE's factors (as llama.cpp's n_ctx)."""
        self.rotary.use_context(context)

    def rotations(self, positions: torch.Tensor) -> list:
        """The step's RoPE tables: [global, local] (local only where the config has one)."""
        tables = [self.rotary(positions)]
        if self.rotary_local is not None:
            tables.append(self.rotary_local(positions))
        return tables

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata) -> torch.Tensor:
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"{len(kv_caches)} KV caches for {len(self.layers)} layers")
        hidden = self.embed(input_ids)
        rotations = self.rotations(positions)
        if self.stack is not None:
            return run_stack(self.stack, hidden, rotations, kv_caches, meta)
        residual = None
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            rope = self.config.rope(i)
            hidden, residual = layer(hidden, residual, rotations[rope] if rope >= 0 else None, kv_cache, meta)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, d] -> float32 logits [N, vocab] (matmul in the weight dtype)."""
        return self.lm_head(hidden).float()
