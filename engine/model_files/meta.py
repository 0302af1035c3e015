"""Model metadata read from the model files themselves (GGUF header, or config.json + safetensors
headers for GPTQ/AWQ directories) — never guessed from a file name. The store's import, the
engine's `--model PATH` and its footprint all read a model through here."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import gguf  # constants only (file types, block sizes); no torch

from engine.model_files.errors import ModelFileError
from engine.model_files.families import hf_family, hf_model_types, swa_period
from engine.model_files.footprint import KERNEL_TYPES, kernel_matrix
from engine.model_files.gguf_file import GGUF_MAGIC, GGUFFile, GGUFFormatError
from engine.model_files.quant_config import parse_quantization_config
from engine.model_files.safetensors_file import safetensors_header

MAX_JSON_BYTES = 16 << 20  # config.json / safetensors headers larger than this are not real models


@dataclass(frozen=True)
class ModelMeta:
    format: str  # "gguf" | "gptq" | "awq" | "compressed-tensors"
    name: str | None
    architecture: str
    parameter_count: int
    context_length: int | None
    quantization: str
    num_layers: int | None
    num_kv_heads: int | None
    head_dim: int | None  # of the keys
    value_head_dim: int | None = None  # of the values, where it differs (None: head_dim)
    sliding_window: int = 0  # tokens a windowed layer attends to (0: every layer attends to all)
    sliding_layers: int = 0  # how many layers are windowed
    kernels_cover: bool = False  # every matrix of a type Ember's kernels hold quantized (footprint.KERNEL_TYPES)
    active_bytes: int = 0  # weight bytes one token reads (a mixture of experts: its used experts' share); 0: all


def read_meta(path: Path) -> ModelMeta:
    """Metadata of a GGUF file or a GPTQ/AWQ directory; ModelFileError when it is neither."""
    path = Path(path)
    if path.is_dir():
        return read_quantized_dir_meta(path)
    if path.is_file():
        return read_gguf_meta(path)
    raise ModelFileError(f"{path}: no such file or directory")


# --- GGUF -------------------------------------------------------------------------------------

def read_gguf_meta(path: Path) -> ModelMeta:
    path = Path(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        with GGUFFile(path) as header:
            return _gguf_meta(path, header)
    except (GGUFFormatError, OSError) as e:
        raise ModelFileError(f"{path}: corrupt or truncated GGUF: {e}") from e


def _gguf_meta(path: Path, header: GGUFFile) -> ModelMeta:
    field = header.get
    arch = field("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFileError(f"{path}: GGUF metadata has no general.architecture")
    tensors = list(header.tensors.values())
    if not tensors:
        raise ModelFileError(f"{path}: GGUF file holds no tensors")
    for t in tensors:
        if t.nbytes is None:
            raise ModelFileError(f"{path}: tensor {t.name!r} has type {t.type_name} or a shape "
                                 "that is not a whole number of its blocks")
        end = t.offset + t.nbytes
        if end > header.size:
            raise ModelFileError(f"{path}: truncated: tensor {t.name!r} ends at byte {end} "
                                 f"but the file has {header.size} bytes")

    n_heads = _scalar_max(field(f"{arch}.attention.head_count"))
    n_kv = _scalar_max(field(f"{arch}.attention.head_count_kv")) or n_heads
    emb = _scalar_max(field(f"{arch}.embedding_length"))
    head_dim = _scalar_max(field(f"{arch}.attention.key_length"))
    if head_dim is None and emb and n_heads:
        head_dim = emb // n_heads
    num_layers = _scalar_max(field(f"{arch}.block_count"))
    if num_layers is not None and not 0 <= num_layers <= len(tensors):  # every layer has tensors of its own
        raise ModelFileError(f"{path}: implausible {arch}.block_count {num_layers} for a file of "
                             f"{len(tensors)} tensors")
    window, windowed = _sliding_window(arch, field, num_layers or 0)
    name = field("general.name")
    return ModelMeta(
        format="gguf",
        name=name if isinstance(name, str) and name else None,
        architecture=arch,
        parameter_count=sum(t.n_elements for t in tensors),
        context_length=_scalar_max(field(f"{arch}.context_length")),
        quantization=_gguf_quantization(field("general.file_type"), tensors),
        num_layers=num_layers,
        num_kv_heads=n_kv,
        head_dim=head_dim,
        value_head_dim=_scalar_max(field(f"{arch}.attention.value_length")),
        sliding_window=window,
        sliding_layers=windowed,
        kernels_cover=all(t.type_name in KERNEL_TYPES for t in tensors if kernel_matrix(t.name, len(t.shape))),
        active_bytes=active_bytes(tensors, _scalar_max(field(f"{arch}.expert_count")),
                                  _scalar_max(field(f"{arch}.expert_used_count"))),
    )


def active_bytes(tensors, n_experts: int | None, n_used: int | None) -> int:
    """The tensor bytes a token reads: all but the experts it does not take (the stacked
    `*_exps` tensors count n_used / n_experts of theirs); 0 for a model without experts."""
    if not n_experts or not n_used:
        return 0
    experts = sum(t.nbytes for t in tensors if "_exps." in t.name)
    return sum(t.nbytes for t in tensors) - experts + experts * min(n_used, n_experts) // n_experts


def _sliding_window(arch: str, field, num_layers: int) -> tuple[int, int]:
    """(window, how many layers use it)."""
    window = _scalar_max(field(f"{arch}.attention.sliding_window")) or 0
    return window, sum(sliding_layers(arch, window, field(f"{arch}.attention.sliding_window_pattern"), num_layers))


def sliding_layers(arch: str, window: int, pattern, num_layers: int) -> tuple[bool, ...]:
    """Which layers use the sliding window, as llama.cpp's set_swa_pattern reads it: the file's
    per-layer bool array, else its period, else the architecture's own period (a layer i slides
    when i % period < period - 1); no period known: every layer slides."""
    if not window:
        return (False,) * num_layers
    if isinstance(pattern, (list, tuple)):
        return tuple(bool(pattern[i]) if i < len(pattern) else False for i in range(num_layers))
    period = _scalar_max(pattern) if pattern is not None else swa_period(arch)
    if not period:
        return (True,) * num_layers
    return tuple(i % period < period - 1 for i in range(num_layers))


def _scalar_max(value) -> int | None:
    """GGUF ints may be per-layer arrays (e.g. head_count_kv); the max sizes the KV cache."""
    if value is None:
        return None
    try:
        if isinstance(value, (list, tuple)):
            return max((int(v) for v in value), default=None)
        return int(value)
    except (TypeError, ValueError, OverflowError):  # a damaged header: a string or an array where a count belongs
        raise ModelFileError(f"corrupt GGUF metadata: {value!r} is not a count") from None


def _gguf_quantization(file_type, tensors) -> str:
    """general.file_type's name (Q4_K_M...) when set; else the type holding most tensor bytes."""
    if file_type is not None:
        try:
            ft = gguf.LlamaFileType(int(file_type))
        except (TypeError, ValueError, OverflowError):  # unknown or damaged: judge by the tensors
            ft = None
        if ft is not None and ft != gguf.LlamaFileType.GUESSED:
            return ft.name.removeprefix("MOSTLY_").removeprefix("ALL_")
    by_type: dict[str, int] = {}
    for t in tensors:
        if len(t.shape) >= 2:  # 1-d norms/biases are always f32 and say nothing
            by_type[t.qtype] = by_type.get(t.qtype, 0) + t.nbytes
    if not by_type:
        by_type = {t.qtype: 1 for t in tensors}
    return gguf.GGMLQuantizationType(max(by_type, key=by_type.get)).name


# --- GPTQ / AWQ directories ------------------------------------------------------------------

def quantization_config_of(path: Path, config: dict) -> dict | None:
    """config.json's "quantization_config", else AutoGPTQ's quantize_config.json or AutoAWQ's
    quant_config.json beside it (None: a float checkpoint)."""
    q = config.get("quantization_config")
    if isinstance(q, dict):
        return q
    for name in ("quantize_config.json", "quant_config.json"):
        q = read_json(path / name, required=False)
        if q is not None:
            return q
    return None


def read_quantized_dir_meta(path: Path) -> ModelMeta:
    path = Path(path)
    config = read_json(path / "config.json", required=True)
    qcfg = quantization_config_of(path, config)
    if qcfg is None:
        raise ModelFileError(f"{path}: a {config.get('model_type') or 'Hugging Face'} checkpoint without quantization "
                             "(no quantization_config in config.json, no quantize_config.json): Ember imports GGUF "
                             "files, GPTQ/AWQ/compressed-tensors folders and BERT embedding models (converted to "
                             "GGUF); convert this one with llama.cpp's convert_hf_to_gguf.py and import the GGUF")
    spec = parse_quantization_config(qcfg, str(path / "config.json"))
    method = "gptq" if spec.format.startswith("gptq") else str(spec.format)
    bits, group = spec.bits, spec.group_size

    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise ModelFileError(f"{path}: no .safetensors weight files")
    params = 0
    for shard in shards:
        for name, info in safetensors_header(shard).items():
            if name == "__metadata__":
                continue
            n = 1
            for d in info["shape"]:
                n *= int(d)
            if name.endswith((".qzeros", ".scales", ".g_idx", ".weight_scale", ".weight_zero_point",
                              ".weight_shape", ".weight_g_idx")):
                continue  # quantization side data, not parameters
            if name.endswith((".qweight", ".weight_packed")):
                n *= 32 // bits  # int32 words packing 32/bits weights each
            params += n

    arch = config.get("model_type") or (config.get("architectures") or ["unknown"])[0]
    n_heads = config.get("num_attention_heads")
    hidden = config.get("hidden_size")
    head_dim = config.get("head_dim") or (hidden // n_heads if hidden and n_heads else None)
    if hf_family(arch) is None:
        raise ModelFileError(f"{path}: model_type {arch!r}: Ember runs {', '.join(hf_model_types())} checkpoints")
    quant = f"{method.upper()}-INT{bits}" + (f"-G{group}" if group > 0 else "")
    return ModelMeta(
        format=method,
        name=config.get("_name_or_path") or None,
        architecture=str(arch),
        parameter_count=params,
        context_length=config.get("max_position_embeddings"),
        quantization=quant,
        num_layers=config.get("num_hidden_layers"),
        num_kv_heads=config.get("num_key_value_heads") or n_heads,
        head_dim=head_dim,
        kernels_cover=True,  # 4 and 8 bits, the kernels' widths (a layout they lack is held dense at load)
    )


def read_json(path: Path, *, required: bool) -> dict | None:
    """A small JSON object file (config.json and friends); ModelFileError when it is anything else."""
    if not path.is_file():
        if required:
            raise ModelFileError(f"{path}: missing")
        return None
    if path.stat().st_size > MAX_JSON_BYTES:
        raise ModelFileError(f"{path}: too large for a config file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{path}: invalid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ModelFileError(f"{path}: expected a JSON object")
    return data

