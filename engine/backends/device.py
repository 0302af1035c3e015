"""Backend and device choice: which runner (torch or llama.cpp) on which device, and whether it fits.

`choose_backend` is a pure function over a `MachineInfo` and a `ModelFootprint`, so the decision
table is unit-tested with given numbers; `probe_machine` and `model_footprint` read the real
machine and the real model file. The rules (what LM Studio / Ollama users expect):
- GGUF on a CPU → llama.cpp (its quantized kernels are the fastest here); GGUF on CUDA → torch
  (the paged-attention engine runs unchanged on the GPU); GPTQ/AWQ → torch everywhere.
- auto device: CUDA if the model fits in free VRAM, else MPS if it fits, else the CPU if it fits
  in free RAM, else a refusal naming what would fit (a shorter context, a smaller quant).
- auto dtype (the torch engine's dense weights and KV): bf16 on CUDA and on CPUs with fast bf16
  GEMMs (AVX512-BF16 or AMX), float32 elsewhere; llama.cpp keeps the file's own quantization.
Every command that runs a model (`chat`, `generate`, `serve`, the GUI's engine, the benchmarks)
resolves `auto` here, through `engine.backends.decide`, and logs the one decision.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

GiB = 1 << 30
MiB = 1 << 20
# Room for activations, the logits buffer, the allocator and the rest of the process.
RUNTIME_OVERHEAD_BYTES = 512 * MiB
# Use at most this fraction of the memory that is free now; the desktop keeps running beside us.
USABLE_FRACTION = 0.9
# A context shorter than this is not worth suggesting: suggest a smaller model instead.
MIN_USEFUL_CONTEXT = 512

BACKENDS = ("auto", "torch", "llama.cpp")
DEVICES = ("auto", "cuda", "mps", "cpu")
DTYPES = ("auto", "float32", "bfloat16", "float16")
FORMATS = ("gguf", "gptq", "awq")


class BackendError(RuntimeError):
    """The model cannot run with the requested backend/device here; the message says what would."""


@dataclass(frozen=True, slots=True)
class MachineInfo:
    """What the machine has, in bytes; filled by `probe_machine` or by a test."""
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


@dataclass(frozen=True, slots=True)
class ModelFootprint:
    """The model's memory shape: weight bytes and KV bytes per token of context."""
    format: str  # "gguf" | "gptq" | "awq"
    weights_bytes: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    context_length: int  # the model's trained context

    def kv_bytes_per_token(self, kv_dtype_bytes: int) -> int:
        # K and V, per layer, per KV head (GQA stores only the KV heads), head_dim values each.
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_dtype_bytes


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


def _kv_dtype_bytes(backend: str, dtype: str) -> int:
    # llama.cpp keeps its KV cache in f16; torch keeps it in the engine's dtype.
    if backend == "llama.cpp":
        return 2
    return 4 if dtype == "float32" else 2


def estimate_bytes(fp: ModelFootprint, backend: str, context_length: int, dtype: str) -> int:
    """Weights + KV for one sequence at `context_length` + overhead: the least that must fit."""
    kv = fp.kv_bytes_per_token(_kv_dtype_bytes(backend, dtype)) * context_length
    return fp.weights_bytes + kv + RUNTIME_OVERHEAD_BYTES


def max_context_that_fits(fp: ModelFootprint, backend: str, dtype: str, available: int,
                          multiple: int = 256) -> int:
    """Longest context (rounded down to `multiple`) whose estimate fits in `available` bytes."""
    room = int(available * USABLE_FRACTION) - fp.weights_bytes - RUNTIME_OVERHEAD_BYTES
    per_token = fp.kv_bytes_per_token(_kv_dtype_bytes(backend, dtype))
    if room <= 0:
        return 0
    return min(fp.context_length, room // per_token) // multiple * multiple


def _fits(fp: ModelFootprint, backend: str, ctx: int, dtype: str, available: int) -> bool:
    return estimate_bytes(fp, backend, ctx, dtype) <= available * USABLE_FRACTION


def _available(m: MachineInfo, device: str) -> int:
    if device == "cuda":
        return m.cuda_free_bytes
    if device == "mps":  # unified memory: bounded by both the GPU's limit and free RAM
        return min(m.mps_max_bytes or m.ram_free_bytes, m.ram_free_bytes)
    return m.ram_free_bytes


def _backend_for(fmt: str, device: str, requested: str, m: MachineInfo) -> str | None:
    """The backend to use for this format on this device, or None when none can."""
    llama_ok = fmt == "gguf" and m.llama_cpp_available and (device == "cpu" or m.llama_cpp_gpu_offload)
    if requested == "llama.cpp":
        return "llama.cpp" if llama_ok else None
    if requested == "torch":
        return "torch"
    # auto: llama.cpp's kernels on a CPU (and on Metal, when this build has it); torch elsewhere.
    if llama_ok and (device == "cpu" or (device == "mps" and m.llama_cpp_gpu_offload)):
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
    if device != "auto" and not _device_ok(m, device):
        raise BackendError(f"device {device!r} was requested but is not available on this machine")

    candidates = [device] if device != "auto" else [d for d in ("cuda", "mps", "cpu") if _device_ok(m, d)]
    skipped: list[str] = []
    for dev in candidates:
        be = _backend_for(fp.format, dev, backend, m)
        if be is None:
            skipped.append(f"{dev}: llama.cpp in this build cannot run on {dev}")
            continue
        avail = _available(m, dev)
        dt, dt_why = choose_dtype(m, be, dev, dtype)
        need = estimate_bytes(fp, be, ctx, dt)
        if _fits(fp, be, ctx, dt, avail):
            why = (f"{fp.format.upper()} on {dev}: {be} "
                   f"({_gib(need)} needed of {_gib(avail)} free, context {ctx}); {dt}: {dt_why}")
            if skipped:
                why += "; skipped " + "; ".join(skipped)
            return BackendDecision(be, dev, why, need, ctx, avail, dt)
        skipped.append(f"{dev}: needs {_gib(need)}, {_gib(avail)} free")

    if device != "auto" and _backend_for(fp.format, device, backend, m) is None:
        raise BackendError(f"the llama.cpp backend cannot run on {device} with this build; "
                           "use --backend torch or --device cpu")
    raise BackendError(_refusal(m, fp, backend, candidates, ctx, "float32" if dtype == "auto" else dtype, skipped))


def _refusal(m: MachineInfo, fp: ModelFootprint, backend: str, devices: list[str], ctx: int,
             dtype: str, skipped: list[str]) -> str:
    """Say what would fit: the longest context on the roomiest device, or how small a quant must be."""
    best_dev = max(devices, key=lambda d: _available(m, d))
    be = _backend_for(fp.format, best_dev, backend, m) or "torch"
    avail = _available(m, best_dev)
    msg = (f"the model does not fit: {'; '.join(skipped)} "
           f"(weights {_gib(fp.weights_bytes)}, context {ctx}).")
    short = max_context_that_fits(fp, be, dtype, avail)
    if short >= MIN_USEFUL_CONTEXT:
        msg += f" A shorter context would fit on {best_dev}: --max-model-len {short}."
    # Weights budget at a minimal useful context; quant size scales ~linearly with bits/weight.
    kv_min = fp.kv_bytes_per_token(_kv_dtype_bytes(be, dtype)) * min(ctx, MIN_USEFUL_CONTEXT)
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
    """AVX512-BF16 or AMX, read from /proc/cpuinfo (Linux; elsewhere: no)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def probe_machine() -> MachineInfo:
    """Read what this machine has now: free RAM (psutil), CUDA free VRAM, MPS, llama.cpp build, bf16."""
    import psutil
    import torch

    vm = psutil.virtual_memory()
    cuda = torch.cuda.is_available()
    free = total = 0
    name = ""
    if cuda:
        free, total = torch.cuda.mem_get_info()
        name = torch.cuda.get_device_name()
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    mps_max = int(torch.mps.recommended_max_memory()) if mps else 0
    try:
        import llama_cpp
        llama_ok, offload = True, bool(llama_cpp.llama_supports_gpu_offload())
    except ImportError:
        llama_ok, offload = False, False
    return MachineInfo(ram_free_bytes=int(vm.available), ram_total_bytes=int(vm.total),
                       cpu_count=os.cpu_count() or 1, cuda_available=cuda, cuda_name=name,
                       cuda_free_bytes=int(free), cuda_total_bytes=int(total), mps_available=mps,
                       mps_max_bytes=mps_max, llama_cpp_available=llama_ok,
                       llama_cpp_gpu_offload=offload, cpu_fast_bf16=cpu_has_fast_bf16())


def model_footprint(path: str | os.PathLike) -> ModelFootprint:
    """Read a model's footprint from the file itself: a .gguf file or a GPTQ/AWQ directory."""
    p = Path(path)
    if p.is_file():
        from engine.loaders.gguf_loader import read_model_config
        cfg = read_model_config(p)
        return ModelFootprint("gguf", p.stat().st_size, cfg.num_layers, cfg.num_kv_heads,
                              cfg.head_dim, cfg.context_length)
    if not p.is_dir() or not (p / "config.json").is_file():
        raise BackendError(f"{p} is neither a GGUF file nor a model directory with config.json")
    hf = json.loads((p / "config.json").read_text())
    qc = hf.get("quantization_config") or {}
    method = str(qc.get("quant_method", "")).lower()
    if method not in ("gptq", "awq"):
        raise BackendError(f"{p}: quantization method {method or 'none'!r} is not GPTQ or AWQ")
    heads = int(hf["num_attention_heads"])
    weights = sum(f.stat().st_size for f in p.glob("*.safetensors"))
    return ModelFootprint(method, weights, int(hf["num_hidden_layers"]),
                          int(hf.get("num_key_value_heads", heads)),
                          int(hf.get("head_dim") or hf["hidden_size"] // heads),
                          int(hf.get("max_position_embeddings", 4096)))
