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
what is data (engine/model_files/families.py); this file turns a family and a header into a
ModelConfig and the family's tensors into our weights.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as QT

from engine.layers.rope_scaling import RopeScaling
from engine.layers.rotary import partial_rotary_order
from engine.loaders.assemble import assemble
from engine.loaders.dequant import SUPPORTED_TYPES, byte_tensor, dequantize
from engine.loaders.repack import REPACKABLE, repack
from engine.loaders.weight_names import FUSED, FUSED_IN_FILE, GLOBALS, NORMS
from engine.model_files.families import FAMILIES, NOT_YET, Family
from engine.model_files.gguf_file import GGUFFile, GGUFFormatError, TensorInfo
from engine.model_files.meta import sliding_layers
from engine.models.config import ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.weights.quant_weight import QuantWeight, cat_rows


class GGUFError(ValueError):
    """A GGUF file Ember cannot load; the message names the file and the problem."""


# Generous bounds (the largest open models are far inside them); anything beyond is corrupt.
MAX_DIM = {"hidden_size": 1 << 16, "intermediate_size": 1 << 20, "num_layers": 1024,
           "num_heads": 1024, "num_kv_heads": 1024, "head_dim": 1024, "vocab_size": 1 << 22,
           "context_length": 1 << 24}


def open_gguf(path: str | Path) -> GGUFFile:
    """Map a GGUF file and parse its header; every failure is a GGUFError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"{path}: no such file")
    try:
        return GGUFFile(path)
    except GGUFFormatError as e:
        raise GGUFError(f"{path}: {e}") from e
    except (OSError, ValueError) as e:  # e.g. mmap of an empty file
        raise GGUFError(f"{path}: cannot read as GGUF ({type(e).__name__}: {e})") from e


def _int(f: GGUFFile, key: str, default: int | None = None) -> int:
    value = f.get(key, default)
    if isinstance(value, list):  # per-layer arrays (e.g. head_count_kv): only uniform ones
        if not value or any(v != value[0] for v in value):
            raise GGUFError(f"{f.path}: {key} varies per layer ({value[:8]}...), unsupported")
        value = value[0]
    if value is None:
        raise GGUFError(f"{f.path}: missing metadata {key}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GGUFError(f"{f.path}: metadata {key} = {value!r} is not a number")
    return int(value)


def _dim(f: GGUFFile, key: str, bound: int, default: int | None = None) -> int:
    """A dimension from the metadata, refused unless in 1..bound (checked before any use)."""
    value = _int(f, key, default)
    if not 0 < value <= bound:
        raise GGUFError(f"{f.path}: absurd {key} = {value} (expected 1..{bound})")
    return value


def config_from_file(f: GGUFFile) -> ModelConfig:
    """ModelConfig from metadata and the tensor directory (which tensors exist, embedding rows)."""
    name = f.path
    arch = f.get("general.architecture")
    if arch in NOT_YET:
        raise GGUFError(f"{name}: architecture {arch!r}: {NOT_YET[arch]} (the llama.cpp backend runs it)")
    if arch not in FAMILIES:
        raise GGUFError(f"{name}: unsupported architecture {arch!r} (supported: {', '.join(FAMILIES)})")
    family = FAMILIES[arch]
    tensors = f.tensors
    if "token_embd.weight" not in tensors:
        raise GGUFError(f"{name}: missing tensor token_embd.weight")
    embd = tensors["token_embd.weight"].shape
    hidden = _dim(f, f"{arch}.embedding_length", MAX_DIM["hidden_size"])
    n_heads = _dim(f, f"{arch}.attention.head_count", MAX_DIM["num_heads"])
    n_kv = _dim(f, f"{arch}.attention.head_count_kv", MAX_DIM["num_kv_heads"], n_heads)
    if n_heads % n_kv:
        raise GGUFError(f"{name}: head_count {n_heads} is not a multiple of head_count_kv {n_kv}")
    head_dim = _dim(f, f"{arch}.attention.key_length", MAX_DIM["head_dim"], hidden // n_heads or 1)
    if _int(f, f"{arch}.attention.value_length", head_dim) != head_dim:
        raise GGUFError(f"{name}: key_length and value_length differ (unsupported)")
    rope_dim = _int(f, f"{arch}.rope.dimension_count", head_dim)
    if rope_dim != head_dim and (family.rope_interleaved or rope_dim % 2 or not 0 < rope_dim < head_dim):
        raise GGUFError(f"{name}: partial RoPE ({rope_dim} of {head_dim} dims) is unsupported")
    long_rope = {"rope_factors_long.weight", "rope_factors_short.weight"} <= tensors.keys()
    original = int(f.get(f"{arch}.rope.scaling.original_context_length", 0) or 0)
    if any(t.startswith("rope_factors_") for t in tensors) and not (long_rope and original > 0):
        raise GGUFError(f"{name}: LongRoPE needs rope_factors_long, rope_factors_short and "
                        f"{arch}.rope.scaling.original_context_length")
    scaling = None
    kind = f.get(f"{arch}.rope.scaling.type", "none")
    if long_rope and kind in ("longrope", "su"):  # the factors say it all
        kind = "none"
    factor = float(f.get(f"{arch}.rope.scaling.factor", 0.0) or 0.0)
    if kind == "none" and f.get(f"{arch}.rope.scale_linear") is not None:  # older files
        kind, factor = "linear", float(f.get(f"{arch}.rope.scale_linear"))
    if kind == "linear" and factor not in (0.0, 1.0):
        scaling = RopeScaling("linear", factor, f.get(f"{arch}.rope.scaling.original_context_length"))
    elif kind not in ("none", "linear"):
        raise GGUFError(f"{name}: RoPE scaling {kind!r} is unsupported (supported: none, linear)")
    num_layers = _dim(f, f"{arch}.block_count", MAX_DIM["num_layers"])
    cfg = ModelConfig(
        arch=arch, vocab_size=embd[0], hidden_size=hidden,
        intermediate_size=_dim(f, f"{arch}.feed_forward_length", MAX_DIM["intermediate_size"]),
        num_layers=num_layers, num_heads=n_heads, num_kv_heads=n_kv,
        head_dim=head_dim, rms_norm_eps=float(f.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(f.get(f"{arch}.rope.freq_base", 10000.0)), rope_scaling=scaling,
        context_length=_dim(f, f"{arch}.context_length", MAX_DIM["context_length"]),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors, rope_freq_factors="rope_freqs.weight" in tensors,
        rotary_dim=rope_dim if rope_dim != head_dim else 0,
        rope_attn_factor=float(f.get(f"{arch}.rope.scaling.attn_factor", 1.0) or 1.0),
        rope_long_factors=long_rope, rope_original_context=original if long_rope else 0,
        **family_fields(f, family, hidden, n_heads, num_layers))
    if not 0 < cfg.vocab_size <= MAX_DIM["vocab_size"]:
        raise GGUFError(f"{name}: absurd vocab_size = {cfg.vocab_size} (expected 1..{MAX_DIM['vocab_size']})")
    if head_dim % 2:
        raise GGUFError(f"{name}: odd head_dim {head_dim}")
    vocab_meta = f.get(f"{arch}.vocab_size")
    if vocab_meta is not None and int(vocab_meta) != cfg.vocab_size:
        raise GGUFError(f"{name}: token_embd has {cfg.vocab_size} rows but {arch}.vocab_size is {vocab_meta}")
    return cfg


def family_fields(f: GGUFFile, family: Family, hidden: int, n_heads: int, num_layers: int) -> dict:
    """The ModelConfig fields a family's description and the header decide together: which layers
    slide and with which RoPE, the query scale, the embedding scale."""
    arch = family.name
    window = 0 if family.ignores_sliding_window else _int(f, f"{arch}.attention.sliding_window", 0)
    slides = sliding_layers(arch, window, f.get(f"{arch}.attention.sliding_window_pattern"), num_layers)
    rope = [1 if s and family.local_rope_base else 0 for s in slides]
    if family.no_rope_period:
        rope = [-1 if (i + 1) % family.no_rope_period == 0 else r for i, r in enumerate(rope)]
    scale = (hidden / n_heads) ** -0.5 if num_layers in family.attention_scale_by_layers else None
    # ggml scales by sqrtf(n_embd): the float32 value, kept exactly
    embed_scale = torch.tensor(math.sqrt(hidden), dtype=torch.float32).item() if family.embed_scale_sqrt_hidden else 1.0
    return dict(qk_norm=family.qk_norm, post_norms=family.post_norms, activation=family.activation,
                embed_scale=embed_scale,
                attention_scale=scale, rope_theta_local=family.local_rope_base,
                layer_windows=tuple(window if s else 0 for s in slides) if any(slides) else (),
                layer_rope=tuple(rope) if any(rope) else ())


def read_model_config(path: str | Path) -> ModelConfig:
    """The model's configuration from the file's metadata and tensor directory (no weights read)."""
    return config_from_file(open_gguf(path))


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> torch shape the metadata implies."""
    d, q, kv, f = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    fused = FAMILIES[cfg.arch].fused_projections
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
        if fused:
            shapes[p + "ffn_up.weight"] = (2 * f, d)
        else:
            shapes |= {p + "ffn_gate.weight": (f, d), p + "ffn_up.weight": (f, d)}
        shapes[p + "ffn_down.weight"] = (d, f)
        if cfg.attention_bias:
            shapes |= {p + "attn_q.bias": (q,), p + "attn_k.bias": (kv,), p + "attn_v.bias": (kv,)}
        if cfg.qk_norm:
            shapes |= {p + "attn_q_norm.weight": (cfg.head_dim,), p + "attn_k_norm.weight": (cfg.head_dim,)}
        if cfg.post_norms:
            shapes |= {p + "post_attention_norm.weight": (d,), p + "post_ffw_norm.weight": (d,)}
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
    return all(QT(t.qtype) in REPACKABLE for t in f.tensors.values() if len(t.shape) == 2)


def load_model(path: str | Path, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu", quantized: bool = False) -> LlamaForCausalLM:
    """Read, check and assemble the model on `device`. Dense weights end up in `dtype`; with
    `quantized`, every matrix of a repackable type (engine/loaders/repack.py) stays 4/8-bit."""
    f = open_gguf(path)
    cfg = config_from_file(f)
    tensors = check_tensors(f, cfg)
    permuted, fused = FAMILIES[cfg.arch].rope_interleaved, FAMILIES[cfg.arch].fused_projections
    held_dense: set[str] = set()  # filled while the model takes its weights

    def get(tname: str, quant: bool):
        t = tensors[tname]
        if quant and QT(t.qtype) in REPACKABLE:
            return repack(byte_tensor(f.raw(t)), QT(t.qtype), t.shape)
        if quant:
            held_dense.add(f"{t.type_name} tensors (Ember's kernels have no repack for them)")
        return dequantize(f.raw(t), QT(t.qtype), t.shape, device)

    def qk(kind: str, n: int, part: str, quant: bool):
        w = get(f"{kind}.{part}", quant)
        if not permuted:
            return w
        if isinstance(w, QuantWeight):
            return w.rows(unpermute_rows(torch.arange(w.shape[0]), n))
        return unpermute_rows(w, n)

    def fuse(parts: list) -> torch.Tensor | QuantWeight:
        if all(isinstance(p, QuantWeight) for p in parts):
            return cat_rows(parts)
        return torch.cat([p.dequantize() if isinstance(p, QuantWeight) else p for p in parts])

    def take(key: str) -> torch.Tensor | QuantWeight | None:
        """Our weight name (engine/models/llama.py WEIGHT_NAMES) -> tensor in dtype on device."""
        layer, _, leaf = key.partition(".")[2].partition(".") if key.startswith("layers.") else ("", "", key)
        p = f"blk.{layer}."
        quant = quantized and leaf in QUANTIZABLE
        name, _, part = leaf.rpartition(".")
        if name in FUSED:  # rows [q | k | v], [gate | up], or one matrix
            if part == "bias" and not cfg.attention_bias:
                return None
            stems = FUSED[name][0]
            if fused and name in FUSED_IN_FILE:
                w = get(p + f"{FUSED_IN_FILE[name]}.{part}", quant)
            elif name == "qkv_proj":
                w = fuse([qk(p + stems[0], cfg.num_heads, part, quant), qk(p + stems[1], cfg.num_kv_heads, part, quant),
                          get(p + f"{stems[2]}.{part}", quant)])
            else:
                parts = [get(p + f"{stem}.{part}", quant) for stem in stems]
                w = parts[0] if len(parts) == 1 else fuse(parts)
        elif leaf in ("rope_freqs", "rope_factors_short", "rope_factors_long"):
            return get(f"{leaf}.weight", False)  # stays float32: folded into the RoPE frequencies
        elif layer:  # a norm
            w = get(p + f"{NORMS[name][0]}.weight", quant)
        else:
            w = get(GLOBALS[leaf], quant)
        if cfg.rotary_dim and leaf in ROTARY_ROWS:  # partial rotary: each head's dims moved (rotary.py)
            order = rotary_rows(cfg, leaf)
            w = w.rows(order) if isinstance(w, QuantWeight) else w[order]
        return w.to(device) if isinstance(w, QuantWeight) else w.to(device=device, dtype=dtype)

    return assemble(cfg, take, dtype, f.path, held_dense)
