"""One table of weight names: ours (engine/models/llama.py), GGUF's and Hugging Face's.

Our model fuses q|k|v and gate|up into one matrix each; a file holds them apart, so a fused
weight names the GGUF tensor stems and the Hugging Face modules it is made of, rows in that
order (Phi's GGUF files already fuse them: engine/model_files/families.py fused_projections).
Where a family's Hugging Face checkpoints fuse or name them otherwise, its Family says so
(hf_fused, hf_norm_renames). Per-layer names only; the embedding, the final norm and the head
are the three globals.
"""
from __future__ import annotations

from engine.model_files.families import Family

# our fused per-layer weight -> (GGUF stems, Hugging Face modules), rows in this order
FUSED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "qkv_proj": (("attn_q", "attn_k", "attn_v"), ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    "o_proj": (("attn_output",), ("self_attn.o_proj",)),
    "gate_up_proj": (("ffn_gate", "ffn_up"), ("mlp.gate_proj", "mlp.up_proj")),
    "down_proj": (("ffn_down",), ("mlp.down_proj",)),
}
# the same as the files of fused_projections families store them
FUSED_IN_FILE = {"qkv_proj": "attn_qkv", "gate_up_proj": "ffn_up"}
# our per-layer norm -> (GGUF stem, Hugging Face module as Llama-style checkpoints name it; None
# where they have none: Gemma's sandwich norms, named by its Family's hf_norm_renames)
NORMS: dict[str, tuple[str, str | None]] = {
    "input_layernorm": ("attn_norm", "input_layernorm"),
    "post_attention_layernorm": ("ffn_norm", "post_attention_layernorm"),
    "q_norm": ("attn_q_norm", "self_attn.q_norm"),
    "k_norm": ("attn_k_norm", "self_attn.k_norm"),
    "attn_output_norm": ("post_attention_norm", None),
    "mlp_output_norm": ("post_ffw_norm", None),
}
# A mixture of experts' layer (engine/layers/moe.py): our `router.weight` is the file's router,
# and our `experts.{e}.<fused>.weight` expert e's slice of the file's stacked tensors
# ([n_expert, rows, in]), rows fused in this order as the dense MLP's are.
ROUTER = "ffn_gate_inp"
EXPERTS: dict[str, tuple[str, ...]] = {"gate_up_proj": ("ffn_gate_exps", "ffn_up_exps"), "down_proj": ("ffn_down_exps",)}
# A shared expert (Routing.shared_expert): our `shared_expert.<fused>` is a dense gated MLP of the
# file's *_shexp matrices, and `shared_expert_gate` the row whose sigmoid scales its output.
SHARED_EXPERT: dict[str, tuple[str, ...]] = {"shared_expert.gate_up_proj": ("ffn_gate_shexp", "ffn_up_shexp"),
                                             "shared_expert.down_proj": ("ffn_down_shexp",)}
SHARED_EXPERT_GATE = "ffn_gate_inp_shexp"
# our global weights -> GGUF tensors
GLOBALS = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
HF_LINEARS: tuple[str, ...] = tuple(m for _, hfs in FUSED.values() for m in hfs)


def hf_norms(family: Family) -> dict[str, str]:
    """Our per-layer norm -> its Hugging Face module in the family's checkpoints."""
    return {ours: hf for ours, (_, hf) in NORMS.items() if hf is not None} | dict(family.hf_norm_renames)


def hf_stored(family: Family) -> dict[str, tuple[str, ...]]:
    """Our fused per-layer weight -> the Hugging Face modules the family's checkpoints store it as."""
    fused = dict(family.hf_fused)
    return {ours: (fused[ours],) if ours in fused else hfs for ours, (_, hfs) in FUSED.items()}


def hf_part(family: Family, module: str) -> tuple[str, str, int] | None:
    """A linear (self_attn.k_proj) that the family's files store inside a fused one: (our fused
    weight, the stored module, its index among the parts); None when it is stored as itself."""
    for ours, stored in family.hf_fused:
        parts = FUSED[ours][1]
        if module in parts:
            return ours, stored, parts.index(module)
    return None


def hf_to_gguf(family: Family) -> dict[str, str]:
    """Hugging Face module (per layer) -> GGUF tensor stem, linears and norms, for the family."""
    linears = {hf: g for gguf, hfs in FUSED.values() for g, hf in zip(gguf, hfs)}
    linears |= {stored: FUSED_IN_FILE[ours] for ours, stored in family.hf_fused}
    return linears | {hf: NORMS[ours][0] for ours, hf in hf_norms(family).items()}
