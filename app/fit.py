"""Will a model fit on this machine, and with what context length and how many parallel chats?

Memory a loaded model needs (llama.cpp's accounting, simplified):
    weights      = the model file's size (quantized weights are used as stored)
    overhead     = 256 MiB + 5% of the weights (compute buffers, tokenizer, runtime)
    KV per token = 2 (K and V) × layers × kv_heads × head_dim × bytes per element (2 for f16/bf16)
The KV budget is what is left of `memory_fraction` × available memory after weights and overhead;
    max_context  = min(the model's context length, KV budget / KV per token), rounded down to 256
    max_parallel = KV budget / (KV per token × min(chat_context, max_context)), capped at max_slots.
A GPU is used when the weights and at least `min_context` tokens of KV fit in its free memory.
"""
from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass

import psutil

log = logging.getLogger(__name__)

MIB = 1 << 20
GIB = 1 << 30
OVERHEAD_BYTES = 256 * MIB
OVERHEAD_FRACTION = 0.05
CONTEXT_STEP = 256


@dataclass(frozen=True)
class MachineInfo:
    ram_total: int
    ram_available: int
    vram_total: int = 0  # 0: no usable GPU
    vram_free: int = 0
    gpu_name: str | None = None


@dataclass(frozen=True)
class FitAdvice:
    fits: bool
    max_context: int
    max_parallel: int
    reason: str
    device: str = "cpu"  # where the advice assumes the model runs: "cpu" | "cuda"
    kv_bytes_per_token: int | None = None
    needed_bytes: int = 0  # weights + overhead + KV for max_context × 1 chat


def probe_machine(use_torch: bool = True) -> MachineInfo:
    """RAM from psutil; VRAM from torch.cuda when torch is importable and sees a GPU."""
    vm = psutil.virtual_memory()
    vram_total = vram_free = 0
    name = None
    if use_torch:
        try:
            torch = importlib.import_module("torch")
            if torch.cuda.is_available():
                vram_free, vram_total = torch.cuda.mem_get_info(0)
                name = torch.cuda.get_device_name(0)
        except Exception as e:  # no torch, a broken driver: CPU advice only
            log.debug("no GPU information: %s", e)
    return MachineInfo(vm.total, vm.available, int(vram_total), int(vram_free), name)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, bytes_per_elem: int = 2) -> int:
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_elem


def _attr(meta, name):
    return meta.get(name) if isinstance(meta, dict) else getattr(meta, name, None)


def fit_advice(size_bytes: int, meta, machine: MachineInfo | None = None, *, kv_bytes_per_elem: int = 2,
               chat_context: int = 4096, max_slots: int = 16, min_context: int = 512,
               memory_fraction: float = 0.9) -> FitAdvice:
    """Advice for a model of `size_bytes` whose `meta` has num_layers, num_kv_heads, head_dim and
    context_length (a ModelManifest, CatalogEntry, ModelConfig or dict)."""
    machine = machine or probe_machine()
    estimated = ""
    if not size_bytes:  # a catalog entry whose file size is not known: its parameters × bits estimate
        size_bytes, estimated = _attr(meta, "estimated_size_bytes"), " (estimated size)"
    if not size_bytes or size_bytes <= 0:
        return FitAdvice(False, 0, 0, "model size unknown")
    ctx_max = _attr(meta, "context_length") or 4096
    layers, kv_heads, hd = (_attr(meta, k) for k in ("num_layers", "num_kv_heads", "head_dim"))
    per_tok = kv_bytes_per_token(layers, kv_heads, hd, kv_bytes_per_elem) if layers and kv_heads and hd else None
    fixed = size_bytes + OVERHEAD_BYTES + int(OVERHEAD_FRACTION * size_bytes)

    def plan(device: str, available: int) -> FitAdvice:
        budget = int(memory_fraction * available)
        kv_budget = budget - fixed
        if per_tok is None:
            ok = kv_budget > 0
            return FitAdvice(ok, ctx_max if ok else 0, 1 if ok else 0,
                             f"weights {_gib(fixed)} of {_gib(budget)} usable on {device}; KV size unknown",
                             device, None, fixed)
        ctx = min(ctx_max, max(0, kv_budget) // per_tok // CONTEXT_STEP * CONTEXT_STEP)
        if ctx >= ctx_max or ctx >= min_context:
            slots = max(1, min(max_slots, kv_budget // (per_tok * min(chat_context, ctx))))
            reason = (f"fits on {device}: {_gib(fixed)} for weights, {_gib(kv_budget)} left for the KV cache "
                      f"({per_tok // 1024} KiB/token) → {ctx} tokens, {slots} chats of {min(chat_context, ctx)}")
            return FitAdvice(True, ctx, slots, reason + estimated, device, per_tok, fixed + ctx * per_tok)
        need = fixed + min_context * per_tok
        return FitAdvice(False, 0, 0, f"needs {_gib(need)} with a {min_context}-token context; "
                                      f"{_gib(budget)} usable on {device}{estimated}", device, per_tok, need)

    if machine.vram_free > 0:
        gpu = plan("cuda", machine.vram_free)
        if gpu.fits:
            return gpu
    return plan("cpu", machine.ram_available)


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"
