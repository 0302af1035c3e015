"""Which models stay loaded: the memory budget, the most models at once, how long an idle model
stays, and the rule that picks what to unload for a new one. Pure data and functions, no torch.

Ollama's scheduler is the model (`OLLAMA_MAX_LOADED_MODELS`, `keep_alive`, unload the least
recently used idle runner when the next does not fit); vLLM and llama-server serve one model per
process. A model is *busy* while a request holds it (from the moment its handler asked for it to
the end of its stream) or has sequences in the engine; a busy model is never unloaded under a
request. The budget counts what each resident model may take: its weights, its KV pool's cap and
the runtime (engine/model_files/memory.py's estimate before a load, the runner's own figures after).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.model_files.footprint import GiB, RUNTIME_OVERHEAD_BYTES
from engine.model_files.memory import KV_CACHE_MAX_BYTES

if TYPE_CHECKING:
    from engine.service.served_model import LoadedModel

DEFAULT_MAX_MODELS = 3  # Ollama's default on a CPU (OLLAMA_MAX_LOADED_MODELS: 3 per GPU, 3 without)
DEFAULT_KEEP_ALIVE_S = 300.0  # Ollama's 5 minutes
DEFAULT_MAX_QUEUE = 64  # requests waiting for memory; one more gets 503 with Retry-After
DEFAULT_MAX_WAIT_S = 600.0  # a request waits this long for memory at most, then 503
BUDGET_SHARE_OF_RAM = 0.75  # the automatic budget: the rest is the desktop's and the app's


def total_ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: a conservative guess
        return 8 * GiB


def rss_bytes() -> int:
    """What this process holds now: the budget's count is checked against it (logged, and shown)."""
    import psutil

    return int(psutil.Process().memory_info().rss)


@dataclass(frozen=True, slots=True)
class ResidencyConfig:
    """The knobs (Settings → Engine; `serve --memory-budget --max-loaded-models --keep-alive`).
    `keep_alive_s` None keeps an idle model until memory is short or it is unloaded by hand."""
    budget_bytes: int = 0  # 0: BUDGET_SHARE_OF_RAM of the machine's memory
    max_models: int = DEFAULT_MAX_MODELS
    keep_alive_s: float | None = DEFAULT_KEEP_ALIVE_S
    max_queue: int = DEFAULT_MAX_QUEUE
    max_wait_s: float = DEFAULT_MAX_WAIT_S

    def __post_init__(self) -> None:
        if self.max_models < 1:
            raise ValueError(f"max_models must be at least 1, not {self.max_models}")
        if self.budget_bytes < 0:
            raise ValueError(f"the memory budget must be 0 (automatic) or more, not {self.budget_bytes}")

    @property
    def budget(self) -> int:
        return self.budget_bytes or int(total_ram_bytes() * BUDGET_SHARE_OF_RAM)

    def kv_cap_bytes(self, weights_bytes: int) -> int:
        """Each model's KV pool is capped at its share of the budget (an even split over
        max_models, less its weights), never above the engine's own cap: a runner sizes its
        pool from free memory, which would otherwise leave nothing for the next model. At least
        1 byte: the pool then holds one full context, its floor (memory.py)."""
        share = self.budget // self.max_models - weights_bytes - RUNTIME_OVERHEAD_BYTES
        return max(min(share, KV_CACHE_MAX_BYTES), 1)


@dataclass(slots=True)
class Resident:
    """A loaded model and what keeps it: requests that hold it, its sequences, its expiry."""
    loaded: LoadedModel
    bytes: int  # what the budget counts for it
    last_used: float
    holds: int = 0  # requests that asked for it and have not ended
    requests: set[str] = field(default_factory=set)  # its request ids in the engine
    keep_alive_s: float | None = DEFAULT_KEEP_ALIVE_S  # the newest request's wish
    expires_at: float | None = None  # wall-clock time it unloads if still idle (None: stays)
    engine_time: float = 0.0  # seconds of steps it has had: the engine thread shares time by it

    @property
    def busy(self) -> bool:
        """Held by a request, or running one. Background work alone (a warm) leaves it idle: a
        model only warming is unloaded for a request that needs the room, its warm ended."""
        engine = self.loaded.engine
        return self.holds > 0 or (engine.has_unfinished() and engine.scheduler.has_foreground())

    def idle_since(self, now: float, wall: float) -> None:
        """It just became idle: it stays keep_alive seconds from now (`wall` is time.time())."""
        self.last_used = now
        self.expires_at = None if self.keep_alive_s is None else wall + self.keep_alive_s


def evictions(residents: dict[str, Resident], need: int, cfg: ResidencyConfig) -> list[str] | None:
    """The idle models to unload, least recently used first, so that a model of `need` bytes
    fits beside the rest (asked only while no other load is in flight); [] when it fits
    already, None when it cannot fit until a busy model becomes idle."""
    used = sum(r.bytes for r in residents.values())
    count = len(residents)
    out: list[str] = []
    for mid, r in sorted(residents.items(), key=lambda kv: kv[1].last_used):
        if used + need <= cfg.budget and count < cfg.max_models:
            break
        if r.busy:
            continue
        out.append(mid)
        used, count = used - r.bytes, count - 1
    if used + need <= cfg.budget and count < cfg.max_models:
        return out
    return None
