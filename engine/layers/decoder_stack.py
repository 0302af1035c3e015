"""The whole decoder stack as one C++ op (engine/kernels/csrc/decoder.cpp) when every matrix is
quantized: the same forward as LlamaForCausalLM's layers, with every family's switches, minus
~40 torch dispatches per layer, which at one token per step cost more than the layer's
arithmetic (profile in the CPU-kernels issue: 14 ms of a 18 ms SmolLM2 step was Python and
small ops).

A mixture of experts' FFN (engine/layers/moe.py) is one call of the stack per layer
(engine/kernels/csrc/moe.cpp): the layer's router, then each expert's gate_up and down, then a
shared expert's (with its gate's row) where the family has one.

The op holds references to the model's own tensors (no copies, except float32 norm weights).
"""
from __future__ import annotations

import torch

from engine.kernels import CpuPath, default_path, kernels
from engine.layers.attention import AttentionMetadata
from engine.layers.moe import MoE
from engine.layers.quant_linear import QuantLinear
from engine.models.config import ModelConfig

ACTIVATION_IDS = {"silu": 0, "gelu_tanh": 1}  # decoder.cpp's Switches


def stack_switches(c: ModelConfig) -> dict[str, float]:
    """The family's switches as decoder.cpp's Switches struct reads them, by name (it refuses a
    name missing or unknown); a new switch is a key here and a field there."""
    f = c.family
    return {"qk_norm": float(f.qk_norm), "post_norms": float(f.post_norms),
            "activation": float(ACTIVATION_IDS[f.activation]), "scale": c.scale}


def ffn_linears(mlp) -> tuple:
    """The FFN's matrices in the stack's order: gate_up, down; a mixture's, expert by expert,
    then its shared expert's."""
    if isinstance(mlp, MoE):
        shared = (mlp.shared_gate_up, mlp.shared_down) if mlp.shared_gate is not None else ()
        return tuple(lin for pair in zip(mlp.gate_up, mlp.down) for lin in pair) + shared
    return mlp.gate_up_proj, mlp.down_proj


def build_stack(model, path: CpuPath | None = None):
    """A torch.classes.ember.DecoderStack over `model`'s layers, or None when a layer has a
    dense or act-order matrix (or the kernels are missing): then the model runs its Python layers."""
    if kernels() is None or model.device.type != "cpu":
        return None
    linears = [(layer.self_attn.qkv_proj, layer.self_attn.o_proj, *ffn_linears(layer.mlp)) for layer in model.layers]
    if not all(isinstance(lin, QuantLinear) and lin.perm is None for group in linears for lin in group):
        return None  # a dense matrix, or an act-order one (its input is permuted in Python)
    c = model.config
    stack = torch.classes.ember.DecoderStack(c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size,
                                             c.intermediate_size, c.rms_norm_eps)
    stack.set_family(stack_switches(c))
    for i, (layer, group) in enumerate(zip(model.layers, linears)):
        stack.add_layer(c.window(i), c.rope(i))
        if isinstance(layer.mlp, MoE):
            mlp = layer.mlp
            stack.add_moe(mlp.router_weight, mlp.top_k, mlp.norm_top_k, mlp.down[0].in_features,
                          mlp.shared_gate_weight, mlp.shared_down.in_features if mlp.shared_down else 0)
        norms = [layer.input_layernorm, layer.post_attention_layernorm]
        if c.family.qk_norm:
            norms += [layer.self_attn.q_norm, layer.self_attn.k_norm]
        if c.family.post_norms:
            norms += [layer.attn_output_norm, layer.mlp_output_norm]
        for norm in norms:
            stack.add_norm(norm.weight.float())
        for lin in group:
            stack.add_linear(lin.qw, lin.scales, lin.mins, lin.bias, lin.out_features, lin.bits, lin.group,
                             lin.scales_super, lin.mins_super)
    stack.add_norm(model.norm.weight.float())
    stack.set_path(int(default_path() if path is None else path))
    return stack


def run_stack(stack, hidden: torch.Tensor, rotations: list[tuple[torch.Tensor, torch.Tensor]],
              kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata) -> torch.Tensor:
    """hidden [T, d] embeddings -> the final normed hidden [T, d] (float32); rotations: the
    step's RoPE tables (global, then local), which each layer indexes."""
    return stack.forward(hidden.float(), [C for C, _ in rotations], [S for _, S in rotations],
                         [k for k, _ in kv_caches], [v for _, v in kv_caches],
                         meta.slot_mapping, meta.block_tables, torch.tensor(meta.seq_lens), meta.query_start_loc,
                         meta.num_decodes)
