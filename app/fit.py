"""Will a model fit on this machine, and with what context length and how many parallel chats?

The model manager's badge and `ember models list|search`. Whether it fits, and where, is the
engine's own admission rule, `choose_backend` (engine/model_files/fit.py), asked on the same
machine at the context the engine would load with; this adds the advice around it:
    max_context  = the longest context that fits there (a multiple of 256, at most the model's)
    max_parallel = KV room / (KV per token × min(chat_context, max_context)), capped at max_slots.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.model_files.fit import BackendError, MachineInfo, choose_backend, probe_host
from engine.model_files.footprint import (MAX_DEFAULT_CONTEXT, GiB, default_context, estimate_bytes, footprint_of,
                                          kv_itemsize, kv_room, max_context_that_fits)
from engine.model_files.memory import describe, engine_memory

__all__ = ["FitAdvice", "MachineInfo", "fit_advice", "probe_host"]


@dataclass(frozen=True)
class FitAdvice:
    fits: bool
    max_context: int
    max_parallel: int
    reason: str
    device: str = "cpu"  # where the engine would run it: "cpu" | "cuda" | "mps"
    kv_bytes_per_token: int | None = None
    needed_bytes: int = 0  # weights + overhead + KV for max_context × 1 chat


def fit_advice(size_bytes: int | None, meta, machine: MachineInfo | None = None, *,
               chat_context: int = MAX_DEFAULT_CONTEXT, max_slots: int = 16) -> FitAdvice:
    """Advice for a model of `size_bytes` whose `meta` has num_layers, num_kv_heads, head_dim,
    context_length and format (a ModelManifest, CatalogEntry, ModelMeta or dict)."""
    machine = machine or probe_host()
    estimated = ""
    if not size_bytes:  # a catalog entry whose file size is not known: its parameters × bits estimate
        est = meta.get("estimated_size_bytes") if isinstance(meta, dict) else getattr(meta, "estimated_size_bytes", None)
        size_bytes, estimated = est, " (estimated size)"
    if not size_bytes or size_bytes <= 0:
        return FitAdvice(False, 0, 0, "model size unknown")
    fp = footprint_of(meta, size_bytes)
    try:  # the context the engine loads with when none is set: the model's own, capped
        d = choose_backend(machine, fp, context_length=default_context(fp.context_length))
    except BackendError as e:  # the engine's own refusal, which names what would fit
        return FitAdvice(False, 0, 0, f"{e}{estimated}")
    per_tok = fp.kv_bytes_per_token(kv_itemsize(d.backend, d.dtype))
    longest = max(d.context_length, max_context_that_fits(fp, d.backend, d.dtype, d.available_bytes))
    if not per_tok:
        return FitAdvice(True, longest, 1, f"weights {_gib(d.est_bytes)} of {_gib(d.available_bytes)} free "
                                           f"on {d.device}; KV size unknown{estimated}", d.device, None, d.est_bytes)
    room = kv_room(fp, d.available_bytes)
    chat = min(chat_context, longest)
    slots = max(1, min(max_slots, room // (per_tok * chat)))
    reason = (f"fits on {d.device} ({d.backend}): {_gib(room)} left for the KV cache after the weights "
              f"({per_tok // 1024} KiB/token) → {longest} tokens, {slots} chats of {chat}. Memory: "
              + describe(engine_memory(fp, d.backend, d.dtype, chat, slots, d.available_bytes), chat, slots))
    return FitAdvice(True, longest, slots, reason + estimated, d.device, per_tok,
                     estimate_bytes(fp, d.backend, longest, d.dtype))


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def memory_line(size_bytes: int, meta, machine: MachineInfo | None = None, *, backend: str = "auto",
                device: str = "auto", dtype: str = "auto", kv_memory_fraction: float = 0.25,
                context: int = MAX_DEFAULT_CONTEXT, chats: int = 4) -> str:
    """Settings' line: the memory the engine takes for `chats` chats of `context` tokens, with the
    backend and dtype `auto` resolves to here (engine/model_files/memory.py, the engine's rule)."""
    machine = machine or probe_host()
    fp = footprint_of(meta, size_bytes)
    context = min(context, fp.context_length)
    try:
        d = choose_backend(machine, fp, backend=backend, device=device, context_length=context, dtype=dtype)
    except BackendError as e:
        return str(e)
    est = engine_memory(fp, d.backend, d.dtype, context, chats, d.available_bytes, kv_memory_fraction)
    return f"{d.backend} on {d.device}: " + describe(est, context, chats)
