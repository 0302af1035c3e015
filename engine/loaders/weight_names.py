"""One table of weight names: ours (engine/models/llama.py), GGUF's and Hugging Face's.

Our model fuses q|k|v and gate|up into one matrix each; a file holds them apart, so a fused
weight names the GGUF tensor stems and the Hugging Face modules it is made of, rows in that
order (Phi's GGUF files already fuse them: engine/model_files/families.py fused_projections).
Per-layer names only; the embedding, the final norm and the head are the three globals.
"""
from __future__ import annotations

# our fused per-layer weight -> (GGUF stems, Hugging Face modules), rows in this order
FUSED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "qkv_proj": (("attn_q", "attn_k", "attn_v"), ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    "o_proj": (("attn_output",), ("self_attn.o_proj",)),
    "gate_up_proj": (("ffn_gate", "ffn_up"), ("mlp.gate_proj", "mlp.up_proj")),
    "down_proj": (("ffn_down",), ("mlp.down_proj",)),
}
# the same as the files of fused_projections families store them
FUSED_IN_FILE = {"qkv_proj": "attn_qkv", "gate_up_proj": "ffn_up"}
# Families whose Hugging Face checkpoints store a fused weight as one module too (Phi3ForCausalLM's
# qkv_proj and gate_up_proj), rows in FUSED's order; elsewhere they are FUSED's parts.
HF_FUSED: dict[str, dict[str, str]] = {"phi3": {"qkv_proj": "self_attn.qkv_proj", "gate_up_proj": "mlp.gate_up_proj"}}
# our per-layer norm -> (GGUF stem, Hugging Face module as Llama-style checkpoints name it; None
# where they have none: Gemma's sandwich norms, named in HF_NORM_RENAMES)
NORMS: dict[str, tuple[str, str | None]] = {
    "input_layernorm": ("attn_norm", "input_layernorm"),
    "post_attention_layernorm": ("ffn_norm", "post_attention_layernorm"),
    "q_norm": ("attn_q_norm", "self_attn.q_norm"),
    "k_norm": ("attn_k_norm", "self_attn.k_norm"),
    "attn_output_norm": ("post_attention_norm", None),
    "mlp_output_norm": ("post_ffw_norm", None),
}
# Families whose Hugging Face norms are named otherwise: Gemma's post_attention_layernorm is the
# norm on the attention OUTPUT (our attn_output_norm); its FFN input norm is pre_feedforward_layernorm.
HF_NORM_RENAMES: dict[str, dict[str, str]] = {"gemma3": {
    "post_attention_layernorm": "pre_feedforward_layernorm", "attn_output_norm": "post_attention_layernorm",
    "mlp_output_norm": "post_feedforward_layernorm"}}
# our global weights -> GGUF tensors
GLOBALS = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
HF_LINEARS: tuple[str, ...] = tuple(m for _, hfs in FUSED.values() for m in hfs)


def hf_norms(arch: str) -> dict[str, str]:
    """Our per-layer norm -> its Hugging Face module in `arch`'s checkpoints."""
    return {ours: hf for ours, (_, hf) in NORMS.items() if hf is not None} | HF_NORM_RENAMES.get(arch, {})


def hf_stored(arch: str) -> dict[str, tuple[str, ...]]:
    """Our fused per-layer weight -> the Hugging Face modules `arch`'s checkpoints store it as."""
    fused = HF_FUSED.get(arch, {})
    return {ours: (fused[ours],) if ours in fused else hfs for ours, (_, hfs) in FUSED.items()}


def hf_part(arch: str, module: str) -> tuple[str, str, int] | None:
    """A linear (self_attn.k_proj) that `arch`'s files store inside a fused one: (our fused
    weight, the stored module, its index among the parts); None when it is stored as itself."""
    for ours, stored in HF_FUSED.get(arch, {}).items():
        parts = FUSED[ours][1]
        if module in parts:
            return ours, stored, parts.index(module)
    return None


def hf_to_gguf(arch: str) -> dict[str, str]:
    """Hugging Face module (per layer) -> GGUF tensor stem, linears and norms, for `arch`."""
    linears = {hf: g for gguf, hfs in FUSED.values() for g, hf in zip(gguf, hfs)}
    linears |= {stored: FUSED_IN_FILE[ours] for ours, stored in HF_FUSED.get(arch, {}).items()}
    return linears | {hf: NORMS[ours][0] for ours, hf in hf_norms(arch).items()}
