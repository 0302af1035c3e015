"""Will a model fit, and where: the one rule behind the engine's admission and the model manager's badge.

`choose_backend` is a pure function over a `MachineInfo` and a `ModelFootprint`. The engine calls
it before loading (engine.backends.decide); the model manager's "fits" badge and `ember models
list` call it too (app/fit.py), on the same numbers, so they cannot disagree. No torch here.

Memory a loaded model needs (one sequence at the context the engine loads with):
    weights + KV per token × context + RUNTIME_OVERHEAD_BYTES  ≤  USABLE_FRACTION × free memory
    KV per token = 2 (K and V) × layers × KV heads × head_dim × bytes per element
(GQA stores only the KV heads.) The rules (what LM Studio / Ollama users expect):
- GGUF on a CPU → torch with Ember's own kernels when they are built and hold every matrix type
  of the file quantized, else llama.cpp; GGUF on CUDA → torch
  (the paged-attention engine runs unchanged on the GPU); GPTQ/AWQ/compressed-tensors → torch everywhere.
- auto device: CUDA if the model fits in free VRAM, else MPS if it fits, else the CPU if it fits
  in free RAM, else a refusal naming what would fit (a shorter context, a smaller quant).
- auto dtype (the torch engine's dense weights and KV): bf16 on CUDA and on CPUs with fast bf16
  GEMMs (AVX512-BF16 or AMX), float32 elsewhere; llama.cpp keeps the file's own quantization.
"""
from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import asdict, dataclass

from engine.kernel_library import cpu_flags, kernels_installed
from engine.model_files.architectures import EMBER_ARCHITECTURES, embeds_only, llama_cpp_runs
from engine.model_files.families import NOT_YET
from engine.model_files.errors import ModelFileError

GiB = 1 << 30
MiB = 1 << 20
# Room for activations, the logits buffer, the allocator and the rest of the process.
RUNTIME_OVERHEAD_BYTES = 512 * MiB
# Use at most this fraction of the memory that is free now; the desktop keeps running beside us.
USABLE_FRACTION = 0.9
# A context shorter than this is not worth suggesting: suggest a smaller model instead.
MIN_USEFUL_CONTEXT = 512
# The context a model loads with unless one is asked for: its own, capped (KV grows with it).
MAX_DEFAULT_CONTEXT = 4096
CONTEXT_STEP = 256  # suggested contexts are multiples of this

BACKENDS = ("auto", "torch", "llama.cpp")
DEVICES = ("auto", "cuda", "mps", "cpu")
DTYPES = ("auto", "float32", "bfloat16", "float16")
FORMATS = ("gguf", "gptq", "awq", "compressed-tensors")


class BackendError(RuntimeError):
    """The model cannot run with the requested backend/device here; the message says what would."""


class UnsupportedArchitecture(BackendError, ModelFileError):
    """No runner of Ember runs this model's architecture: refused at import and at load alike
    (the CLI exits 2 on it)."""


@dataclass(frozen=True, slots=True)
class MachineInfo:
    """What the machine has, in bytes; filled by a probe or by a test."""
    ram_free_bytes: int
    ram_total_bytes: int
    cpu_count: int
    cuda_available: bool = False
    cuda_name: str = ""
    cuda_free_bytes: int = 0
    cuda_total_bytes: int = 0
    mps_available: bool = False
    mps_max_bytes: int = 0  # torch.mps.recommended_max_memory (unified memory, shared with RAM)
    llama_cpp_available: bool = True
    llama_cpp_gpu_offload: bool = False  # this llama.cpp build can offload to a GPU (CUDA/Metal)
    cpu_fast_bf16: bool = False  # AVX512-BF16 or AMX: oneDNN's bf16 GEMMs beat float32
    ember_kernels: bool = False  # Ember's CPU kernels are built and this CPU runs them (AVX2+)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, itemsize: float = 2,
                       value_head_dim: int = 0) -> int:
    """K and V, every layer, only the KV heads: L · n_kv · (hd_k + hd_v) · itemsize (2: f16,
    llama.cpp's KV); hd_v = hd_k unless the model says otherwise."""
    return int(num_layers * num_kv_heads * (head_dim + (value_head_dim or head_dim)) * itemsize)


@dataclass(frozen=True, slots=True)
class ModelFootprint:
    """The model's memory shape: weight bytes and KV bytes per token of context."""
    format: str  # one of FORMATS
    weights_bytes: int
    num_layers: int  # 0 when not known (the KV term is then left out)
    num_kv_heads: int
    head_dim: int
    context_length: int  # the model's trained context
    kernels_cover: bool = False  # every matrix of a type Ember's kernels hold quantized (GPTQ/AWQ: 4 and 8 bits)
    architecture: str = ""  # general.architecture / model_type ("": not known, not checked)
    value_head_dim: int = 0  # 0: the keys' head_dim
    # Windowed layers and their window, from the header. On Ember's engine the KV estimate
    # counts them at their window (kv_bytes); the llama.cpp runner keeps the full cache
    # (swa_full), since its prompt cache and rollbacks need positions that fell out of it.
    sliding_window: int = 0
    sliding_layers: int = 0
    # Ember's own (torch) engine runs it: the Llama/Qwen2 family as its loader accepts them, and
    # every GPTQ/AWQ checkpoint accepted (their reader refuses other model types)
    ember_engine: bool = True
    ember_engine_why_not: str = ""  # the loader's refusal, logged when auto picks llama.cpp for it

    def kv_bytes_per_token(self, kv_dtype_bytes: float) -> int:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, kv_dtype_bytes,
                                  self.value_head_dim)

    @property
    def embeds_only(self) -> bool:
        """An embedding model (an encoder): it makes embeddings, not text (architectures.py)."""
        return embeds_only(self.architecture)

    @property
    def llama_cpp_runs(self) -> bool:
        return self.format == "gguf" and (not self.architecture or llama_cpp_runs(self.architecture))


def footprint_of(meta, weights_bytes: int) -> ModelFootprint:
    """The footprint of anything that carries the KV shape: a ModelMeta, a ModelManifest, a
    CatalogEntry or a dict with num_layers, num_kv_heads, head_dim, context_length (and format)."""
    def get(name):
        return meta.get(name) if isinstance(meta, dict) else getattr(meta, name, None)

    fmt, arch = get("format") or "gguf", get("architecture") or ""
    return ModelFootprint(fmt, int(weights_bytes), get("num_layers") or 0,
                          get("num_kv_heads") or 0, get("head_dim") or 0,
                          get("context_length") or MAX_DEFAULT_CONTEXT,
                          architecture=arch, ember_engine=fmt != "gguf" or not arch or arch in EMBER_ARCHITECTURES,
                          value_head_dim=get("value_head_dim") or 0,
                          sliding_window=get("sliding_window") or 0, sliding_layers=get("sliding_layers") or 0,
                          ember_engine_why_not=NOT_YET.get(arch, "") or (
                              "an embedding model: llama.cpp embeds it" if embeds_only(arch) else ""))


def check_runnable(meta, where: object) -> None:
    """Refuse a model (a ModelMeta or manifest) that no runner of Ember runs, naming `where`."""
    if why := unsupported_architecture(footprint_of(meta, 0)):
        raise UnsupportedArchitecture(f"{where}: {why}")


def unsupported_architecture(fp: ModelFootprint) -> str | None:
    """One line naming the architecture and what Ember runs, when no runner runs it; else None."""
    if fp.ember_engine or fp.llama_cpp_runs:
        return None
    return (f"unsupported architecture {fp.architecture!r}: Ember runs {', '.join(sorted(EMBER_ARCHITECTURES))} "
            "on its own engine and the architectures its llama.cpp knows (qwen3, gemma3, phi3, gpt-oss, ...)")


def default_context(model_context: int, requested: int | None = None) -> int:
    """The context a model loads with: the one asked for, else its own capped at MAX_DEFAULT_CONTEXT;
    never past its own."""
    return min(requested or min(model_context, MAX_DEFAULT_CONTEXT), model_context)


@dataclass(frozen=True, slots=True)
class BackendDecision:
    """The choice, logged at start-up and shown on /health."""
    backend: str  # "torch" | "llama.cpp"
    device: str  # "cuda" | "mps" | "cpu"
    reason: str
    est_bytes: int  # weights + KV of one sequence at `context_length` + runtime overhead
    context_length: int
    available_bytes: int
    dtype: str = "float32"  # the torch engine's dense dtype; llama.cpp computes in float32

    def as_dict(self) -> dict:
        return asdict(self)


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def auto_dtype(device: str, cpu_fast_bf16: bool) -> str:
    """The dense dtype `auto` means for the torch engine on `device`.

    bf16 halves the bytes a decode step reads and doubles the GEMM rate where the hardware has
    bf16 dot products; without them oneDNN runs bf16 on a reference path (an AVX2 EPYC: 16x576x960
    in 11 ms bf16 against 2 ms float32). Both pass the fidelity bar against llama.cpp."""
    if device == "cuda" or (device == "cpu" and cpu_fast_bf16):
        return "bfloat16"
    return "float32"


def choose_dtype(m: MachineInfo, backend: str, device: str, requested: str = "auto") -> tuple[str, str]:
    """(dtype, why) for `backend` on `device`; `requested` other than auto is kept (torch only)."""
    if requested not in DTYPES:
        raise BackendError(f"unknown dtype {requested!r}; choose one of {', '.join(DTYPES)}")
    if backend == "llama.cpp":
        why = "llama.cpp keeps the file's quantized weights"
        return "float32", why + (f" (--dtype {requested} applies to the torch backend)" if requested != "auto" else "")
    if requested != "auto":
        return requested, "as requested"
    dtype = auto_dtype(device, m.cpu_fast_bf16)
    if device == "cpu":
        why = "this CPU has fast bf16 GEMMs" if m.cpu_fast_bf16 else "no AVX512-BF16/AMX on this CPU"
    else:
        why = f"the default on {device}"
    return dtype, f"auto: {why}"


def kv_itemsize(backend: str, dtype: str, kv_cache_dtype: str = "auto") -> float:
    """Bytes per KV element: llama.cpp keeps its KV cache in f16, torch in the engine's dtype,
    unless the cache's own type is set; q8_0 is a byte and a float16 scale per 32 values."""
    if kv_cache_dtype == "q8_0":
        return 17 / 16
    if kv_cache_dtype == "auto":
        kv_cache_dtype = "float16" if backend == "llama.cpp" else dtype
    return 4 if kv_cache_dtype == "float32" else 2


def kv_room(fp: ModelFootprint, available: int) -> int:
    """Bytes left for the KV cache: the usable share of `available` less weights and overhead."""
    return int(available * USABLE_FRACTION) - fp.weights_bytes - RUNTIME_OVERHEAD_BYTES


# Tokens a sliding-window layer of Ember's engine holds beyond its window: the blocks of 16 at
# its edge (engine/kv_window.py keeps the window of the last block boundary, plus the block
# being written).
WINDOW_EDGE_TOKENS = 32


def kv_bytes(fp: ModelFootprint, backend: str, tokens: int, dtype: str) -> int:
    """KV one sequence of `tokens` holds: K and V of every layer per token, except that on
    Ember's engine a sliding-window layer gives back what falls behind its window, so it holds
    at most window + WINDOW_EDGE_TOKENS; llama.cpp's runner keeps the full cache (swa_full)."""
    per_token = fp.kv_bytes_per_token(kv_itemsize(backend, dtype))
    if backend != "torch" or not (fp.sliding_window and fp.sliding_layers and fp.num_layers):
        return per_token * tokens
    per_layer = per_token / fp.num_layers
    held = min(tokens, fp.sliding_window + WINDOW_EDGE_TOKENS)
    return math.ceil(per_layer * ((fp.num_layers - fp.sliding_layers) * tokens + fp.sliding_layers * held))


def estimate_bytes(fp: ModelFootprint, backend: str, context_length: int, dtype: str) -> int:
    """Weights + KV for one sequence at `context_length` + overhead: the least that must fit."""
    return fp.weights_bytes + kv_bytes(fp, backend, context_length, dtype) + RUNTIME_OVERHEAD_BYTES


def max_context_that_fits(fp: ModelFootprint, backend: str, dtype: str, available: int,
                          multiple: int = CONTEXT_STEP) -> int:
    """Longest context (rounded down to `multiple`) whose estimate fits in `available` bytes."""
    room = kv_room(fp, available)
    if room < 0:
        return 0
    lo, hi = 0, fp.context_length  # kv_bytes grows with the tokens: the last that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if kv_bytes(fp, backend, mid, dtype) <= room else (lo, mid - 1)
    return lo // multiple * multiple


def fits(fp: ModelFootprint, backend: str, ctx: int, dtype: str, available: int) -> bool:
    return kv_bytes(fp, backend, ctx, dtype) <= kv_room(fp, available)


def available_bytes(m: MachineInfo, device: str) -> int:
    if device == "cuda":
        return m.cuda_free_bytes
    if device == "mps":  # unified memory: bounded by both the GPU's limit and free RAM
        return min(m.mps_max_bytes or m.ram_free_bytes, m.ram_free_bytes)
    return m.ram_free_bytes


def _ours(fp: ModelFootprint, device: str, m: MachineInfo) -> bool:
    """Ember's kernels run here and hold every matrix of this model quantized (faster: `ember bench decode`)."""
    return device == "cpu" and fp.kernels_cover and m.ember_kernels


def _backend_for(fp: ModelFootprint, device: str, requested: str, m: MachineInfo) -> str | None:
    """The backend to use for this format on this device, or None when none can."""
    llama_ok = fp.llama_cpp_runs and m.llama_cpp_available and (device == "cpu" or m.llama_cpp_gpu_offload)
    if requested == "llama.cpp":
        return "llama.cpp" if llama_ok else None
    if requested == "torch":
        return "torch" if fp.ember_engine else None
    # auto: Ember's kernels, else llama.cpp's on a CPU (and on Metal, when this build has it); torch
    # elsewhere; an architecture only llama.cpp runs goes to llama.cpp wherever this build runs.
    if not fp.ember_engine:
        return "llama.cpp" if llama_ok else None
    if llama_ok and not _ours(fp, device, m) and (device == "cpu" or (device == "mps" and m.llama_cpp_gpu_offload)):
        return "llama.cpp"
    return "torch"


def _device_ok(m: MachineInfo, device: str) -> bool:
    return {"cpu": True, "cuda": m.cuda_available, "mps": m.mps_available}[device]


def choose_backend(m: MachineInfo, fp: ModelFootprint, *, backend: str = "auto",
                   device: str = "auto", context_length: int | None = None,
                   dtype: str = "auto") -> BackendDecision:
    """Pick (backend, device, dtype) for this model on this machine, or raise BackendError saying why."""
    if backend not in BACKENDS:
        raise BackendError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if device not in DEVICES:
        raise BackendError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if dtype not in DTYPES:
        raise BackendError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if fp.format not in FORMATS:
        raise BackendError(f"unknown model format {fp.format!r}; expected one of {', '.join(FORMATS)}")
    ctx = min(context_length or fp.context_length, fp.context_length)
    if backend == "llama.cpp" and fp.format != "gguf":
        raise BackendError(f"the llama.cpp backend runs GGUF files only; this model is {fp.format.upper()}"
                           " (use --backend torch or auto)")
    if backend == "llama.cpp" and not m.llama_cpp_available:
        raise BackendError("the llama.cpp backend needs llama-cpp-python, which is not installed")
    if why := unsupported_architecture(fp):
        raise UnsupportedArchitecture(why)
    arch = fp.architecture
    if backend == "torch" and not fp.ember_engine:
        why = fp.ember_engine_why_not or f"it runs {', '.join(sorted(EMBER_ARCHITECTURES))}, not {arch}"
        raise BackendError(f"Ember's own engine cannot run this model yet ({why}): use --backend llama.cpp or auto")
    if backend == "llama.cpp" and not fp.llama_cpp_runs:
        raise BackendError(f"this llama.cpp does not know the {arch} architecture: use --backend torch or auto")
    if not fp.ember_engine and not m.llama_cpp_available:
        raise BackendError(f"the {arch} architecture runs on llama.cpp, and llama-cpp-python is not installed")
    if device != "auto" and not _device_ok(m, device):
        raise BackendError(f"device {device!r} was requested but is not available on this machine")

    candidates = [device] if device != "auto" else [d for d in ("cuda", "mps", "cpu") if _device_ok(m, d)]
    skipped: list[str] = []
    for dev in candidates:
        be = _backend_for(fp, dev, backend, m)
        if be is None:
            only = f"the {fp.architecture} architecture runs on llama.cpp only, and " if not fp.ember_engine else ""
            skipped.append(f"{dev}: {only}llama.cpp in this build cannot run on {dev}")
            continue
        avail = available_bytes(m, dev)
        dt, dt_why = choose_dtype(m, be, dev, dtype)
        need = estimate_bytes(fp, be, ctx, dt)
        if fits(fp, be, ctx, dt, avail):
            ours = " on Ember's kernels, every matrix kept quantized" if be == "torch" and _ours(fp, dev, m) else ""
            if be == "llama.cpp" and not fp.ember_engine:
                ours = f" (Ember's own engine: {fp.ember_engine_why_not or 'not the ' + fp.architecture + ' architecture yet'})"
            why = (f"{fp.format.upper()} on {dev}: {be}{ours} "
                   f"({_gib(need)} needed of {_gib(avail)} free, context {ctx}); {dt}: {dt_why}")
            if skipped:
                why += "; skipped " + "; ".join(skipped)
            return BackendDecision(be, dev, why, need, ctx, avail, dt)
        skipped.append(f"{dev}: needs {_gib(need)}, {_gib(avail)} free")

    if device != "auto" and _backend_for(fp, device, backend, m) is None:
        other = "--backend torch or " if fp.ember_engine else ""
        raise BackendError(f"the llama.cpp backend cannot run on {device} with this build; use {other}--device cpu")
    raise BackendError(_refusal(m, fp, backend, candidates, ctx, "float32" if dtype == "auto" else dtype, skipped))


def _refusal(m: MachineInfo, fp: ModelFootprint, backend: str, devices: list[str], ctx: int,
             dtype: str, skipped: list[str]) -> str:
    """Say what would fit: the longest context on the roomiest device, or how small a quant must be."""
    best_dev = max(devices, key=lambda d: available_bytes(m, d))
    be = _backend_for(fp, best_dev, backend, m) or "torch"
    avail = available_bytes(m, best_dev)
    msg = (f"the model does not fit: {'; '.join(skipped)} "
           f"(weights {_gib(fp.weights_bytes)}, context {ctx}).")
    short = max_context_that_fits(fp, be, dtype, avail)
    if short >= MIN_USEFUL_CONTEXT:
        msg += f" A shorter context would fit on {best_dev}: --max-model-len {short}."
    # Weights budget at a minimal useful context; quant size scales ~linearly with bits/weight.
    kv_min = kv_bytes(fp, be, min(ctx, MIN_USEFUL_CONTEXT), dtype)
    budget = int(avail * USABLE_FRACTION) - RUNTIME_OVERHEAD_BYTES - kv_min
    if budget > 0:
        floor_gib = math.floor(budget / GiB * 100) / 100  # rounded down: the claim must hold
        msg += (f" A smaller quantization would fit: a model file of at most {floor_gib:.2f} GiB "
                f"(now {_gib(fp.weights_bytes)}, e.g. {budget / fp.weights_bytes:.0%} of its "
                "bits per weight), or a model with fewer parameters.")
    else:
        msg += f" Only {_gib(avail)} is free on {best_dev}: close other programs or use a much smaller model."
    return msg


def cpu_has_fast_bf16() -> bool:
    """AVX512-BF16 or AMX (Linux's CPU flags; elsewhere: no)."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def probe_host() -> MachineInfo:
    """What can be known without importing torch or llama.cpp (the GUI's path): free RAM, CPUs,
    bf16 flags, whether llama-cpp-python is installed. GPUs need torch: engine.backends.probe_machine."""
    import psutil

    vm = psutil.virtual_memory()
    return MachineInfo(ram_free_bytes=int(vm.available), ram_total_bytes=int(vm.total),
                       cpu_count=os.cpu_count() or 1,
                       llama_cpp_available=importlib.util.find_spec("llama_cpp") is not None,
                       cpu_fast_bf16=cpu_has_fast_bf16(), ember_kernels=kernels_installed())
