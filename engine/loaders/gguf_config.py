"""GGUF header -> ModelConfig: every dimension checked against sane bounds before anything is
allocated; which family does what is data (engine/model_files/families.py).
"""
from __future__ import annotations

from pathlib import Path

from engine.layers.rope_scaling import RopeScaling
from engine.model_files.families import FAMILIES, NOT_YET, Family
from engine.model_files.gguf_file import GGUFFile, GGUFFormatError
from engine.model_files.meta import sliding_layers
from engine.models.config import ModelConfig


class GGUFError(ValueError):
    """A GGUF file Ember cannot load; the message names the file and the problem."""


# Generous bounds (the largest open models are far inside them); anything beyond is corrupt.
MAX_DIM = {"hidden_size": 1 << 16, "intermediate_size": 1 << 20, "num_layers": 1024,
           "num_heads": 1024, "num_kv_heads": 1024, "head_dim": 1024, "vocab_size": 1 << 22,
           "context_length": 1 << 24, "num_experts": 4096}


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


def attention_shape(f: GGUFFile, arch: str) -> tuple[int, int, int, int]:
    """(hidden size, query heads, KV heads, head_dim), each checked against MAX_DIM and the others."""
    hidden = _dim(f, f"{arch}.embedding_length", MAX_DIM["hidden_size"])
    n_heads = _dim(f, f"{arch}.attention.head_count", MAX_DIM["num_heads"])
    n_kv = _dim(f, f"{arch}.attention.head_count_kv", MAX_DIM["num_kv_heads"], n_heads)
    if n_heads % n_kv:
        raise GGUFError(f"{f.path}: head_count {n_heads} is not a multiple of head_count_kv {n_kv}")
    head_dim = _dim(f, f"{arch}.attention.key_length", MAX_DIM["head_dim"], hidden // n_heads or 1)
    if _int(f, f"{arch}.attention.value_length", head_dim) != head_dim:
        raise GGUFError(f"{f.path}: key_length and value_length differ (unsupported)")
    return hidden, n_heads, n_kv, head_dim


def long_rope_factors(f: GGUFFile, arch: str) -> tuple[bool, int]:
    """(whether the file has LongRoPE's long and short factors, the original context they need)."""
    long_rope = {"rope_factors_long.weight", "rope_factors_short.weight"} <= f.tensors.keys()
    original = int(f.get(f"{arch}.rope.scaling.original_context_length", 0) or 0)
    if any(t.startswith("rope_factors_") for t in f.tensors) and not (long_rope and original > 0):
        raise GGUFError(f"{f.path}: LongRoPE needs rope_factors_long, rope_factors_short and "
                        f"{arch}.rope.scaling.original_context_length")
    return long_rope, original


def rope_scaling(f: GGUFFile, arch: str, long_rope: bool) -> RopeScaling | None:
    """Linear RoPE scaling from the header (older files: rope.scale_linear); None when there is none."""
    kind = f.get(f"{arch}.rope.scaling.type", "none")
    if long_rope and kind in ("longrope", "su"):  # the factors say it all
        kind = "none"
    factor = float(f.get(f"{arch}.rope.scaling.factor", 0.0) or 0.0)
    if kind == "none" and f.get(f"{arch}.rope.scale_linear") is not None:  # older files
        kind, factor = "linear", float(f.get(f"{arch}.rope.scale_linear"))
    if kind == "linear" and factor not in (0.0, 1.0):
        return RopeScaling("linear", factor, f.get(f"{arch}.rope.scaling.original_context_length"))
    if kind not in ("none", "linear"):
        raise GGUFError(f"{f.path}: RoPE scaling {kind!r} is unsupported (supported: none, linear)")
    return None


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
    hidden, n_heads, n_kv, head_dim = attention_shape(f, arch)
    rope_dim = _int(f, f"{arch}.rope.dimension_count", head_dim)
    if rope_dim != head_dim and (family.rope_interleaved or rope_dim % 2 or not 0 < rope_dim < head_dim):
        raise GGUFError(f"{name}: partial RoPE ({rope_dim} of {head_dim} dims) is unsupported")
    long_rope, original = long_rope_factors(f, arch)
    scaling = rope_scaling(f, arch, long_rope)
    num_layers = _dim(f, f"{arch}.block_count", MAX_DIM["num_layers"])
    experts = expert_fields(f, family)
    cfg = ModelConfig(
        family=family, vocab_size=embd[0], hidden_size=hidden,
        intermediate_size=_dim(f, f"{arch}.feed_forward_length", MAX_DIM["intermediate_size"],
                               experts.get("expert_intermediate_size")),
        num_layers=num_layers, num_heads=n_heads, num_kv_heads=n_kv,
        head_dim=head_dim, rms_norm_eps=float(f.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(f.get(f"{arch}.rope.freq_base", 10000.0)), rope_scaling=scaling,
        context_length=_dim(f, f"{arch}.context_length", MAX_DIM["context_length"]),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors, rope_freq_factors="rope_freqs.weight" in tensors,
        rotary_dim=rope_dim if rope_dim != head_dim else 0,
        rope_attn_factor=float(f.get(f"{arch}.rope.scaling.attn_factor", 1.0) or 1.0),
        rope_long_factors=long_rope, rope_original_context=original if long_rope else 0,
        **experts, **family_fields(f, family, hidden, n_heads, num_layers))
    if not 0 < cfg.vocab_size <= MAX_DIM["vocab_size"]:
        raise GGUFError(f"{name}: absurd vocab_size = {cfg.vocab_size} (expected 1..{MAX_DIM['vocab_size']})")
    if head_dim % 2:
        raise GGUFError(f"{name}: odd head_dim {head_dim}")
    vocab_meta = f.get(f"{arch}.vocab_size")
    if vocab_meta is not None and int(vocab_meta) != cfg.vocab_size:
        raise GGUFError(f"{name}: token_embd has {cfg.vocab_size} rows but {arch}.vocab_size is {vocab_meta}")
    return cfg


def expert_fields(f: GGUFFile, family: Family) -> dict:
    """A mixture of experts' counts and widths from the header ({} for a dense family); the
    MLP's own feed_forward_length is then optional (every layer is experts)."""
    if family.moe is None:
        return {}
    arch = family.name
    n = _dim(f, f"{arch}.expert_count", MAX_DIM["num_experts"])
    used = _dim(f, f"{arch}.expert_used_count", n)
    fields = dict(num_experts=n, num_experts_used=used,
                  expert_intermediate_size=_dim(f, f"{arch}.expert_feed_forward_length", MAX_DIM["intermediate_size"]))
    if family.moe.shared_expert:  # its own width, else the MLP's (llama.cpp's n_ff_shexp)
        bound = MAX_DIM["intermediate_size"]
        fields["shared_expert_intermediate_size"] = _dim(
            f, f"{arch}.expert_shared_feed_forward_length", bound, _dim(f, f"{arch}.feed_forward_length", bound))
    return fields


def family_fields(f: GGUFFile, family: Family, hidden: int, n_heads: int, num_layers: int) -> dict:
    """The family's ModelConfig fields as the GGUF header says: its window and pattern, and the
    query scale by layer count (llama.cpp's rule)."""
    arch = family.name
    scale = (hidden / n_heads) ** -0.5 if num_layers in family.attention_scale_by_layers else None
    return layer_fields(family, num_layers, _int(f, f"{arch}.attention.sliding_window", 0),
                        f.get(f"{arch}.attention.sliding_window_pattern"), scale, family.local_rope_base)


def layer_fields(family: Family, num_layers: int, window: int, pattern,
                 attention_scale: float | None, local_base: float | None) -> dict:
    """The ModelConfig fields a family's description and a file's header (GGUF or config.json)
    decide together: which layers slide and with which RoPE, and the query scale."""
    if family.ignores_sliding_window:
        window = 0
    slides = sliding_layers(family.name, window, pattern, num_layers)
    rope = [1 if s and family.local_rope_base else 0 for s in slides]
    if family.no_rope_period:
        rope = [-1 if (i + 1) % family.no_rope_period == 0 else r for i, r in enumerate(rope)]
    return dict(attention_scale=attention_scale,
                rope_theta_local=float(local_base) if family.local_rope_base else None,
                layer_windows=tuple(window if s else 0 for s in slides) if any(slides) else (),
                layer_rope=tuple(rope) if any(rope) else ())


def read_model_config(path: str | Path) -> ModelConfig:
    """The model's configuration from the file's metadata and tensor directory (no weights read)."""
    return config_from_file(open_gguf(path))
