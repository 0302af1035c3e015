"""A Hugging Face model directory: config.json as a ModelConfig, and its safetensors tensors by name.

The layout GPTQ, AWQ and compressed-tensors checkpoints (and plain float ones) share:
config.json (+ its "quantization_config", or a quantize_config.json / quant_config.json beside
it), one `*.safetensors` file or shards listed by `model.safetensors.index.json`, and the
tokenizer files (engine/loaders/hf_tokenizer.py). Opening checks that every shard the index
names exists and opens, that no tensor is in two shards and that the config's dimensions are
sane; each tensor the config implies is then checked for presence and shape as the loader reads
it (quantized ones by their format: engine/checkpoint_formats/), before any model is returned.
Every failure is a CheckpointError naming the file and the problem.

Hugging Face stores Q/K rows in rotate-half order for every Llama-family architecture (the GGUF
permutation is llama.cpp's own), so nothing is un-permuted here.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from engine.layers.llama3_rope import llama3_factors
from engine.layers.rope_scaling import RopeScaling
from engine.loaders.gguf_config import MAX_DIM, layer_fields
from engine.model_files.families import Family, hf_family, hf_model_types
from engine.model_files.meta import quantization_config_of, read_json
from engine.models.config import ModelConfig
from engine.model_files.quant_config import CheckpointError, QuantSpec, parse_quantization_config

INDEX = "model.safetensors.index.json"


def _dim(config: dict, key: str, where: Path, bound: int, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{where}: {key} = {value!r} is not an integer")
    if not 0 < value <= bound:
        raise CheckpointError(f"{where}: absurd {key} = {value} (expected 1..{bound})")
    return value


def _rope_fields(config: dict, head_dim: int, where: Path) -> dict:
    """RoPE beyond its base: the share of each head it turns (partial_rotary_factor), linear
    scaling, LongRoPE (Phi-3's: factor sets the checkpoint's rope_factors gives, the original
    context, attention_factor, else transformers' sqrt(1 + ln(ratio) / ln(original)))."""
    rs = config.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    rotary = int(head_dim * float(config.get("partial_rotary_factor", 1.0)))
    if rotary % 2 or not 0 < rotary <= head_dim:
        raise CheckpointError(f"{where}: partial_rotary_factor turns {rotary} of {head_dim} dims (need an even count)")
    out = {"rope_scaling": None, "rotary_dim": 0 if rotary == head_dim else rotary}
    if kind == "linear":
        out["rope_scaling"] = RopeScaling("linear", float(rs["factor"]), config.get("max_position_embeddings"))
    elif kind in ("longrope", "su"):
        original = rs.get("original_max_position_embeddings", config.get("original_max_position_embeddings"))
        context = config.get("max_position_embeddings", 4096)
        if not isinstance(original, int) or original <= 0 or any(
                len(rs.get(k) or ()) != rotary // 2 for k in ("short_factor", "long_factor")):
            raise CheckpointError(f"{where}: LongRoPE needs original_max_position_embeddings and "
                                  f"short_factor and long_factor of {rotary // 2} values each")
        ratio = context / original
        attn = rs.get("attention_factor") or (math.sqrt(1 + math.log(ratio) / math.log(original)) if ratio > 1 else 1.0)
        out |= {"rope_long_factors": True, "rope_original_context": original, "rope_attn_factor": float(attn)}
    elif kind == "llama3":  # divisors per frequency, as a GGUF's rope_freqs (HFCheckpoint.rope_factors)
        out["rope_freq_factors"] = True
    elif kind != "default":
        raise CheckpointError(f"{where}: RoPE scaling {kind!r} is unsupported (supported: none, linear, "
                              "longrope, llama3)")
    return out


def _layer_rope(config: dict, family: Family, where: Path) -> tuple[int, ...]:
    """SmolLM3's RoPE-less layers: config.json's no_rope_layers (1: RoPE, 0: none), else every
    no_rope_layer_interval-th (the family's period by default); () when every layer turns."""
    n = config.get("num_hidden_layers")
    flags = config.get("no_rope_layers")
    if flags is None:
        period = config.get("no_rope_layer_interval", family.no_rope_period)
        if not period:
            return ()
        flags = [int((i + 1) % period != 0) for i in range(n)]
    if not isinstance(flags, list) or len(flags) != n or any(f not in (0, 1) for f in flags):
        raise CheckpointError(f"{where}: no_rope_layers must be {n} values of 0 or 1")
    return tuple(0 if f else -1 for f in flags) if 0 in flags else ()


def _flat_rope(config: dict) -> dict:
    """transformers 5's per-layer-type rope_parameters as the flat keys older configs have
    (rope_theta, rope_scaling, Gemma 3's rope_local_base_freq)."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and "rope_type" in params:  # one set for every layer
        params = {"full_attention": params}
    if not isinstance(params, dict) or not isinstance(params.get("full_attention"), dict):
        return config
    full, local = params["full_attention"], params.get("sliding_attention") or {}
    out = dict(config, rope_theta=full.get("rope_theta", config.get("rope_theta")),
               rope_scaling=full if full.get("rope_type", "default") != "default" else None,
               partial_rotary_factor=full.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)))
    if "rope_theta" in local:
        out["rope_local_base_freq"] = local["rope_theta"]
    return out


def _family_fields(config: dict, family: Family, head_dim: int, where: Path) -> dict:
    """The family's switches and what config.json says of its layers: Gemma 3's windows
    (layer_types, else sliding_window_pattern), query_pre_attn_scalar and rope_local_base_freq;
    SmolLM3's RoPE-less layers."""
    n = config.get("num_hidden_layers")
    window, pattern = 0, None
    if family.swa_period:  # the families whose windows llama.cpp runs (Qwen2's configs carry an unused one)
        window = _dim(config, "sliding_window", where, MAX_DIM["context_length"])
        types = config.get("layer_types")
        pattern = config.get("sliding_window_pattern")
        if types is not None:
            if not isinstance(types, list) or len(types) != n:
                raise CheckpointError(f"{where}: layer_types must list {n} layers")
            pattern = [t == "sliding_attention" for t in types]
    qpas = config.get("query_pre_attn_scalar")
    scale = None if qpas in (None, head_dim) else float(qpas) ** -0.5
    fields = layer_fields(family, n, window, pattern, scale,
                          config.get("rope_local_base_freq", family.local_rope_base))
    if family.no_rope_period or "no_rope_layers" in config:
        fields["layer_rope"] = _layer_rope(config, family, where)
    return fields


def model_config(config: dict, where: Path) -> ModelConfig:
    """ModelConfig from config.json (the tensors are checked against it by the loader)."""
    mtype, config = config.get("model_type"), _flat_rope(config)
    family = hf_family(mtype)
    if family is None:
        raise CheckpointError(f"{where}: unsupported model_type {mtype!r} (supported: {', '.join(hf_model_types())})")
    hidden = _dim(config, "hidden_size", where, MAX_DIM["hidden_size"])
    n_heads = _dim(config, "num_attention_heads", where, MAX_DIM["num_heads"])
    n_kv = _dim(config, "num_key_value_heads", where, MAX_DIM["num_kv_heads"], n_heads)
    if n_heads % n_kv:
        raise CheckpointError(f"{where}: num_attention_heads {n_heads} is not a multiple of "
                              f"num_key_value_heads {n_kv}")
    head_dim = config.get("head_dim") or hidden // n_heads
    if not isinstance(head_dim, int) or not 2 <= head_dim <= MAX_DIM["head_dim"] or head_dim % 2:
        raise CheckpointError(f"{where}: head_dim {head_dim!r} is not an even number in 2..{MAX_DIM['head_dim']}")
    return ModelConfig(
        family=family, vocab_size=_dim(config, "vocab_size", where, MAX_DIM["vocab_size"]), hidden_size=hidden,
        intermediate_size=_dim(config, "intermediate_size", where, MAX_DIM["intermediate_size"]),
        num_layers=_dim(config, "num_hidden_layers", where, MAX_DIM["num_layers"]),
        num_heads=n_heads, num_kv_heads=n_kv, head_dim=head_dim,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)), rope_theta=float(config.get("rope_theta", 10000.0)),
        context_length=_dim(config, "max_position_embeddings", where, MAX_DIM["context_length"], 4096),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(config.get("attention_bias", bool(family.hf_attention_bias))),
        **_rope_fields(config, head_dim, where), **_family_fields(config, family, head_dim, where))


class HFCheckpoint:
    """The tensors of a model directory by name, read lazily from their shards."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise CheckpointError(f"{self.path}: not a directory")
        self.config_json = read_json(self.path / "config.json", required=True)
        self.config = model_config(self.config_json, self.path / "config.json")
        self.norm_offset = self.config.family.hf_norm_offset  # Gemma's (1 + w) norms store w
        q = quantization_config_of(self.path, self.config_json)
        self.quant: QuantSpec | None = None if q is None else parse_quantization_config(q, str(self.path / "config.json"))
        self.shards = self._shards()
        self._open: dict[Path, object] = {}
        self.tensors: dict[str, Path] = {}  # name -> shard
        for shard in self.shards:
            for name in self._handle(shard).keys():
                if name in self.tensors:
                    raise CheckpointError(f"{shard}: tensor {name} is also in {self.tensors[name]}")
                self.tensors[name] = shard

    def _shards(self) -> list[Path]:
        index = read_json(self.path / INDEX, required=False)
        if index is None:
            shards = sorted(self.path.glob("*.safetensors"))
            if not shards:
                raise CheckpointError(f"{self.path}: no .safetensors weight files")
            return shards
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{self.path / INDEX}: no weight_map")
        names = sorted(set(weight_map.values()))
        for name in names:
            if not isinstance(name, str) or "/" in name or "\\" in name or not name.endswith(".safetensors"):
                raise CheckpointError(f"{self.path / INDEX}: bad shard name {name!r}")
            if not (self.path / name).is_file():
                raise CheckpointError(f"{self.path / name}: missing shard (listed in {INDEX})")
        return [self.path / n for n in names]

    def _handle(self, shard: Path):
        h = self._open.get(shard)
        if h is None:
            try:
                h = self._open[shard] = safe_open(str(shard), framework="pt")
            except (SafetensorError, OSError, ValueError) as e:
                raise CheckpointError(f"{shard}: not a readable safetensors file ({e})") from e
        return h

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(self._shard(name)).get_slice(name).get_shape())

    def _shard(self, name: str) -> Path:
        shard = self.tensors.get(name)
        if shard is None:
            raise CheckpointError(f"{self.path}: missing tensor {name}")
        return shard

    def get(self, name: str) -> torch.Tensor:
        shard = self._shard(name)
        try:
            return self._handle(shard).get_tensor(name)
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{shard}: cannot read tensor {name} ({e})") from e

    def dense(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """A float tensor of exactly `shape` (float32; the caller casts)."""
        found = self.shape(name)
        if found != tuple(shape):
            raise CheckpointError(f"{self._shard(name)}: tensor {name} has shape {list(found)} but config.json "
                                  f"implies {list(shape)}")
        t = self.get(name)
        if not t.is_floating_point():
            raise CheckpointError(f"{self._shard(name)}: tensor {name} is {t.dtype}, expected a float type")
        return t.float()

    def norm(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """A norm's weight as the engine's plain RMSNorm takes it (Gemma's: 1 + the stored w)."""
        return self.dense(name, shape) + self.norm_offset

    def rope_factors(self) -> dict[str, torch.Tensor]:
        """LongRoPE's factor sets or llama3's divisors from config.json, float32, under the GGUF's
        tensor names (engine/layers/llama3_rope.py)."""
        cfg, rs = self.config, _flat_rope(self.config_json).get("rope_scaling") or {}
        if cfg.rope_freq_factors:
            keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            if any(not isinstance(rs.get(k), (int, float)) for k in keys):
                raise CheckpointError(f"{self.path / 'config.json'}: llama3 RoPE scaling needs {', '.join(keys)}")
            return {"rope_freqs": llama3_factors(cfg.head_dim, cfg.rope_theta, **{k: rs[k] for k in keys})}
        if not cfg.rope_long_factors:
            return {}
        return {f"rope_factors_{k}": torch.tensor(rs[f"{k}_factor"], dtype=torch.float32) for k in ("short", "long")}

    def group(self, prefix: str, suffixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """The tensors `prefix.suffix` that exist (a format checks which it needs)."""
        return {s: self.get(f"{prefix}.{s}") for s in suffixes if f"{prefix}.{s}" in self.tensors}

    def close(self) -> None:
        self._open.clear()
