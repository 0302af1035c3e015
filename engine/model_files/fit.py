"""Will a model fit, and where: the one rule behind the engine's admission and the model manager's badge.

`choose_backend` is a pure function over a `MachineInfo` and a `ModelFootprint`. The engine calls
it before loading (engine.backends.decide); the model manager's "fits" badge and `ember models
list` call it too (app/fit.py), on the same numbers, so they cannot disagree. No torch here.

A model fits where weights + KV at the context + the runtime fit in the usable share of free
memory (engine/model_files/footprint.py). The rules (what LM Studio / Ollama users expect):
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
from engine.model_files.architectures import EMBER_ARCHITECTURES
from engine.model_files.errors import ModelFileError
from engine.model_files.footprint import (RUNTIME_OVERHEAD_BYTES, USABLE_FRACTION, GiB, ModelFootprint,
                                          estimate_bytes, fits, footprint_of, kv_bytes, max_context_that_fits)
from engine.model_files.projector import PROJECTOR_REFUSAL, is_projector

# A context shorter than this is not worth suggesting: suggest a smaller model instead.
MIN_USEFUL_CONTEXT = 512

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


def check_runnable(meta, where: object) -> None:
    """Refuse a model (a ModelMeta or manifest) that no runner of Ember runs, naming `where`."""
    if why := unsupported_architecture(footprint_of(meta, 0)):
        raise UnsupportedArchitecture(f"{where}: {why}")


def unsupported_architecture(fp: ModelFootprint) -> str | None:
    """One line naming the architecture and what Ember runs, when no runner runs it; else None."""
    if fp.ember_engine or fp.llama_cpp_runs:
        return None
    if is_projector(fp.architecture):
        return PROJECTOR_REFUSAL
    return (f"unsupported architecture {fp.architecture!r}: Ember runs {', '.join(sorted(EMBER_ARCHITECTURES))} "
            "on its own engine and the architectures its llama.cpp knows (qwen3, gemma3, phi3, gpt-oss, ...)")


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


def available_bytes(m: MachineInfo, device: str) -> int:
    if device == "cuda":
        return m.cuda_free_bytes
    if device == "mps":  # unified memory: bounded by both the GPU's limit and free RAM
        return min(m.mps_max_bytes or m.ram_free_bytes, m.ram_free_bytes)
    return m.ram_free_bytes


def _ours(fp: ModelFootprint, device: str, m: MachineInfo) -> bool:
    """Ember's kernels run here and hold every matrix of this model quantized (faster: `ember bench decode`)."""
    return device == "cpu" and fp.kernels_cover and m.ember_kernels


# Where `auto` runs a mixture of experts on a CPU whose kernels hold it. On Ember's Python layers one
# stream decoded at 0.47x llama.cpp's speed, so it went to llama.cpp; the native decoder stack runs
# its experts (engine/kernels/csrc/moe.cpp) at 1.12x (`ember bench decode`, a random 4-layer qwen3moe
# Q4_0 file, issue 68), so it runs on Ember's engine. True sends it to llama.cpp again, saying MOE_WHY_LLAMA_CPP.
MOE_ON_LLAMA_CPP = False
MOE_WHY_LLAMA_CPP = "a mixture of experts decodes faster on llama.cpp; --backend torch runs it on Ember's engine"
MOE_NATIVE = "its experts in Ember's native stack"


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
    if MOE_ON_LLAMA_CPP and llama_ok and fp.active_bytes and device == "cpu":
        return "llama.cpp"
    return "torch"


def _runner_why(fp: ModelFootprint, backend: str, device: str, m: MachineInfo, requested: str) -> str:
    """Why this runner runs the model: Ember's kernels, or what keeps Ember's engine off it."""
    if backend == "torch":
        if not _ours(fp, device, m):
            return ""
        return " on Ember's kernels, every matrix kept quantized" + (f", {MOE_NATIVE}" if fp.active_bytes else "")
    if not fp.ember_engine:
        return f" (Ember's own engine: {fp.ember_engine_why_not or 'not the ' + fp.architecture + ' architecture yet'})"
    if requested == "llama.cpp":
        return " (as requested)"
    if MOE_ON_LLAMA_CPP and fp.active_bytes and device == "cpu" and _ours(fp, device, m):
        return f" ({MOE_WHY_LLAMA_CPP})"
    if device == "cpu" and fp.format == "gguf":  # a family Ember runs, in a file its kernels do not hold
        return " (Ember's kernels are not built here)" if not m.ember_kernels else (
            " (a matrix type of this file is not on Ember's kernels)" if not fp.kernels_cover else "")
    return ""


def _experts(fp: ModelFootprint) -> str:
    """A mixture of experts: the file is held whole, and a token reads only its experts' share."""
    if not fp.active_bytes:
        return ""
    return f"; a mixture of experts: {_gib(fp.active_bytes)} of its {_gib(fp.weights_bytes)} read per token"


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
            why = (f"{fp.format.upper()} on {dev}: {be}{_runner_why(fp, be, dev, m, backend)} "
                   f"({_gib(need)} needed of {_gib(avail)} free, context {ctx}){_experts(fp)}; {dt}: {dt_why}")
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
