"""GGUF -> ModelConfig and a ready LlamaForCausalLM (dense weights in the asked dtype, or 4/8-bit).

Everything is checked before anything big is allocated: the magic and header counts against the
file size, the architecture, every dimension against sane bounds, and every tensor's presence,
type, shape (from the metadata) and byte range (inside the file). Only then are tensors
dequantized, one at a time, straight from the memory map.

llama-family files (NORM RoPE in llama.cpp) store Q/K rows permuted for interleaved RoPE pairs
(convert_hf_to_gguf.py `permute`: HF row s*hd/2 + j of a head goes to row 2j + s). We undo it:
    w.reshape(n_h, hd/2, 2, in).swapaxes(1, 2).reshape(w.shape)     # row 2j+s -> s*hd/2 + j
so the model uses one rotate-half RoPE. Whole rows move, so this is exact on any block type.
qwen2, qwen3 and gemma3 (NEOX RoPE) are stored in HF order and left alone. Which family does
what is data (engine/model_files/families.py); gguf_config.py turns a family and a header into
a ModelConfig, this file the family's tensors into our weights.
"""
from __future__ import annotations

from pathlib import Path

import torch
from gguf import GGMLQuantizationType as QT

from engine.layers.rotary import partial_rotary_order
from engine.loaders.assemble import assemble
from engine.loaders.dequant import SUPPORTED_TYPES, byte_tensor, dequantize
from engine.loaders.gguf_config import GGUFError, config_from_file, open_gguf
from engine.loaders.gguf_blocks import REPACKABLE, from_gguf_blocks
from engine.loaders.weight_names import (EXPERTS, FUSED, FUSED_IN_FILE, GLOBALS, NORMS, ROUTER, SHARED_EXPERT,
                                         SHARED_EXPERT_GATE)
from engine.model_files.footprint import kernel_matrix
from engine.model_files.gguf_file import GGUFFile, TensorInfo
from engine.models.config import ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.weights.quant_weight import QuantWeight, cat_rows


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> torch shape the metadata implies."""
    d, q, kv, f = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    fused = cfg.family.fused_projections
    shapes = {"token_embd.weight": (cfg.vocab_size, d), "output_norm.weight": (d,)}
    if not cfg.tie_word_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, d)
    if cfg.rope_freq_factors:
        shapes["rope_freqs.weight"] = (cfg.head_dim // 2,)
    if cfg.rope_long_factors:
        shapes |= dict.fromkeys(("rope_factors_long.weight", "rope_factors_short.weight"),
                                ((cfg.rotary_dim or cfg.head_dim) // 2,))
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        shapes[p + "attn_norm.weight"] = (d,)
        if fused:  # q|k|v and gate|up as the file stores them
            shapes[p + "attn_qkv.weight"] = (q + 2 * kv, d)
        else:
            shapes |= {p + "attn_q.weight": (q, d), p + "attn_k.weight": (kv, d), p + "attn_v.weight": (kv, d)}
        shapes |= {p + "attn_output.weight": (d, q), p + "ffn_norm.weight": (d,)}
        if cfg.num_experts:
            shapes |= expert_tensors(cfg, p)
        elif fused:
            shapes[p + "ffn_up.weight"] = (2 * f, d)
        else:
            shapes |= {p + "ffn_gate.weight": (f, d), p + "ffn_up.weight": (f, d)}
        if not cfg.num_experts:
            shapes[p + "ffn_down.weight"] = (d, f)
        if cfg.attention_bias:
            shapes |= {p + "attn_q.bias": (q,), p + "attn_k.bias": (kv,), p + "attn_v.bias": (kv,)}
        if cfg.family.qk_norm:
            shapes |= {p + "attn_q_norm.weight": (cfg.head_dim,), p + "attn_k_norm.weight": (cfg.head_dim,)}
        if cfg.family.post_norms:
            shapes |= {p + "post_attention_norm.weight": (d,), p + "post_ffw_norm.weight": (d,)}
    return shapes


def expert_tensors(cfg: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    """A mixture of experts' router [n_expert, d] and stacked experts [n_expert, rows, in]."""
    n, d, f = cfg.num_experts, cfg.hidden_size, cfg.expert_intermediate_size
    shapes = {p + f"{ROUTER}.weight": (n, d), p + "ffn_gate_exps.weight": (n, f, d),
              p + "ffn_up_exps.weight": (n, f, d), p + "ffn_down_exps.weight": (n, d, f)}
    if s := cfg.shared_expert_intermediate_size:  # a shared expert: a gated MLP and its gate's row
        shapes |= {p + "ffn_gate_shexp.weight": (s, d), p + "ffn_up_shexp.weight": (s, d),
                   p + "ffn_down_shexp.weight": (d, s), p + f"{SHARED_EXPERT_GATE}.weight": (d,)}
    return shapes


def check_tensors(f: GGUFFile, cfg: ModelConfig) -> dict[str, TensorInfo]:
    """Every expected tensor present, of a supported type, of the right shape, inside the file."""
    supported = ", ".join(sorted(q.name for q in SUPPORTED_TYPES))
    for tname, shape in expected_tensors(cfg).items():
        t = f.tensors.get(tname)
        if t is None:
            raise GGUFError(f"{f.path}: missing tensor {tname}")
        if t.qtype not in SUPPORTED_TYPES:
            raise GGUFError(f"{f.path}: tensor {tname} has type {t.type_name}, which Ember cannot load "
                            f"(supported: {supported})")
        if t.shape != shape:
            raise GGUFError(f"{f.path}: tensor {tname} has shape {t.shape} but the metadata implies {shape}")
        if t.nbytes is None or t.offset + t.nbytes > f.size:
            raise GGUFError(f"{f.path}: tensor {tname} ends at byte {t.offset + (t.nbytes or 0)}, past the end "
                            f"of the {f.size}-byte file (truncated)")
    return f.tensors


def unpermute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Interleaved-pair rows (GGUF llama) -> rotate-half rows (HF); weights [out, in] or biases [out]."""
    hd = w.shape[0] // n_heads
    return w.reshape(n_heads, hd // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


# Our weights that are matrices a QuantLinear can hold (the table only as a tied head or its rows).
QUANTIZABLE = ("qkv_proj.weight", "o_proj.weight", "gate_up_proj.weight", "down_proj.weight",
               "lm_head.weight", "embed_tokens.weight")


ROTARY_ROWS = ("qkv_proj.weight", "qkv_proj.bias", "q_norm.weight", "k_norm.weight")


def rotary_rows(cfg: ModelConfig, leaf: str) -> torch.Tensor:
    """The row order that moves a partial rotary's turning dims where rotate-half turns them:
    each q and k head by partial_rotary_order, v as it is; a q/k norm weight is one head."""
    order = partial_rotary_order(cfg.head_dim, cfg.rotary_dim)
    if leaf in ("q_norm.weight", "k_norm.weight"):
        return order
    heads = torch.arange(cfg.num_heads + cfg.num_kv_heads)[:, None] * cfg.head_dim + order
    return torch.cat((heads.flatten(), torch.arange(cfg.q_size + cfg.kv_size, cfg.q_size + 2 * cfg.kv_size)))


def kernels_cover(f: GGUFFile) -> bool:
    """Every matrix of the file has a repack, so the whole model can stay quantized."""
    return all(QT(t.qtype) in REPACKABLE for t in f.tensors.values() if kernel_matrix(t.name, len(t.shape)))


def _fuse(parts: list) -> torch.Tensor | QuantWeight:
    """Rows of several tensors as one: quantized when all are, else dense."""
    if all(isinstance(p, QuantWeight) for p in parts):
        return cat_rows(parts)
    return torch.cat([p.dequantize() if isinstance(p, QuantWeight) else p for p in parts])


class GGUFWeights:
    """A checked file's tensors as our weights, one at a time, in `dtype` on `device`; with
    `quantized`, every matrix of a repackable type stays 4/8-bit (held_dense names the rest)."""

    def __init__(self, f: GGUFFile, cfg: ModelConfig, tensors: dict[str, TensorInfo], dtype: torch.dtype,
                 device: str | torch.device, quantized: bool) -> None:
        self.f, self.cfg, self.tensors = f, cfg, tensors
        self.dtype, self.device, self.quantized = dtype, device, quantized
        self.permuted, self.fused = cfg.family.rope_interleaved, cfg.family.fused_projections
        self.held_dense: set[str] = set()  # filled while the model takes its weights

    def get(self, tname: str, quant: bool):
        t = self.tensors[tname]
        if quant and QT(t.qtype) in REPACKABLE:
            return from_gguf_blocks(byte_tensor(self.f.raw(t)), QT(t.qtype), t.shape)
        if quant:
            self.held_dense.add(f"{t.type_name} tensors (Ember's kernels have no repack for them)")
        return dequantize(self.f.raw(t), QT(t.qtype), t.shape, self.device)

    def expert(self, p: str, leaf: str, quant: bool):
        """Expert e's `experts.{e}.<fused>.weight`: its slice of each stacked tensor, in the file's
        type (quantized: straight from the slice's blocks), rows fused as weight_names.EXPERTS says."""
        _, e, name = leaf.split(".", 2)
        parts = []
        for stem in EXPERTS[name.removesuffix(".weight")]:
            t = self.tensors[f"{p}{stem}.weight"]
            per = t.nbytes // t.shape[0]
            raw, shape = self.f.raw(t)[int(e) * per:(int(e) + 1) * per], t.shape[1:]
            if quant and QT(t.qtype) in REPACKABLE:
                parts.append(from_gguf_blocks(byte_tensor(raw), QT(t.qtype), shape))
            else:
                if quant:
                    self.held_dense.add(f"{t.type_name} experts (Ember's kernels have no repack for them)")
                parts.append(dequantize(raw, QT(t.qtype), shape, self.device))
        return parts[0] if len(parts) == 1 else _fuse(parts)

    def qk(self, kind: str, n: int, part: str, quant: bool):
        """A query or key projection in rotate-half row order."""
        w = self.get(f"{kind}.{part}", quant)
        if not self.permuted:
            return w
        if isinstance(w, QuantWeight):
            return w.rows(unpermute_rows(torch.arange(w.shape[0]), n))
        return unpermute_rows(w, n)

    def take(self, key: str) -> torch.Tensor | QuantWeight | None:
        """Our weight name (engine/models/llama.py WEIGHT_NAMES) -> tensor in dtype on device."""
        cfg, get, qk = self.cfg, self.get, self.qk
        layer, _, leaf = key.partition(".")[2].partition(".") if key.startswith("layers.") else ("", "", key)
        p = f"blk.{layer}."
        quant = self.quantized and leaf in QUANTIZABLE
        name, _, part = leaf.rpartition(".")
        if leaf.startswith("experts."):
            w = self.expert(p, leaf, self.quantized)
        elif leaf == "router.weight":  # float32 whatever the file's type (footprint.kernel_matrix)
            return get(p + f"{ROUTER}.weight", False).to(self.device)
        elif leaf == "shared_expert_gate.weight":  # a row [d], float32 as the router
            return get(p + f"{SHARED_EXPERT_GATE}.weight", False).to(self.device)
        elif name in SHARED_EXPERT:  # a gated MLP's matrices, as a dense layer's
            parts = [get(p + f"{stem}.weight", self.quantized) for stem in SHARED_EXPERT[name]]
            w = parts[0] if len(parts) == 1 else _fuse(parts)
        elif name in FUSED:  # rows [q | k | v], [gate | up], or one matrix
            if part == "bias" and not cfg.attention_bias:
                return None
            stems = FUSED[name][0]
            if self.fused and name in FUSED_IN_FILE:
                w = get(p + f"{FUSED_IN_FILE[name]}.{part}", quant)
            elif name == "qkv_proj":
                w = _fuse([qk(p + stems[0], cfg.num_heads, part, quant),
                           qk(p + stems[1], cfg.num_kv_heads, part, quant), get(p + f"{stems[2]}.{part}", quant)])
            else:
                parts = [get(p + f"{stem}.{part}", quant) for stem in stems]
                w = parts[0] if len(parts) == 1 else _fuse(parts)
        elif leaf in ("rope_freqs", "rope_factors_short", "rope_factors_long"):
            return get(f"{leaf}.weight", False)  # stays float32: folded into the RoPE frequencies
        elif layer:  # a norm
            w = get(p + f"{NORMS[name][0]}.weight", quant)
        else:
            w = get(GLOBALS[leaf], quant)
        if cfg.rotary_dim and leaf in ROTARY_ROWS:  # partial rotary: each head's dims moved (rotary.py)
            order = rotary_rows(cfg, leaf)
            w = w.rows(order) if isinstance(w, QuantWeight) else w[order]
        return w.to(self.device) if isinstance(w, QuantWeight) else w.to(device=self.device, dtype=self.dtype)


def load_model(path: str | Path, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu", quantized: bool = False) -> LlamaForCausalLM:
    """Read, check and assemble the model on `device`. Dense weights end up in `dtype`; with
    `quantized`, every matrix of a repackable type (engine/loaders/gguf_blocks.py) stays 4/8-bit."""
    f = open_gguf(path)
    cfg = config_from_file(f)
    weights = GGUFWeights(f, cfg, check_tensors(f, cfg), dtype, device, quantized)
    return assemble(cfg, weights.take, dtype, f.path, weights.held_dense)
