"""The engine thread's published status, built from its ModelSet: what /health, /v1/engine/status
and /api/ps read. Runs on the engine thread; the result is immutable."""
from __future__ import annotations

import logging
import time

from engine.service.handle import EngineState, EngineStatus, MemoryStatus, ModelStatus, QueuedLoad
from engine.service.model_set import ModelSet

log = logging.getLogger(__name__)


def failed_load_words(error: str, serving: list[str]) -> str:
    """"loading X failed: why; A, B are still loaded": a failed load never touches the others."""
    if not serving:
        return error
    return f"{error}; {', '.join(serving)} {'is' if len(serving) == 1 else 'are'} still loaded"


def snapshot(models: ModelSet, loaded_msg: str) -> EngineStatus:
    residents = sorted(models.residents.values(), key=lambda r: r.last_used, reverse=True)
    entries = []
    for r in residents:
        try:
            stats = r.loaded.engine.stats()
        except Exception:
            log.exception("engine.stats() of %s failed", r.loaded.spec.id)
            stats = None
        entries.append(ModelStatus(r.loaded.spec, "ready", r.loaded, r.bytes, len(r.requests),
                                   None if r.busy else r.expires_at, stats))
    now = time.monotonic()
    queue, position, loading = [], 0, None
    for p in models.pending.values():
        if p.loading:
            loading = p.spec
            entries.append(ModelStatus(p.spec, "loading", bytes=p.need))
            continue
        position += 1
        queue.append(QueuedLoad(p.spec.id, position, round(now - p.since, 3), len(p.waiters)))
    used = sum(m.bytes for m in entries)
    memory = MemoryStatus(models.cfg.budget, used, models.cfg.max_models)
    newest = residents[0].loaded if residents else None
    if newest is not None:
        state = EngineState.READY
        message = loaded_msg
        if models.last_error:  # a refused or failed load: what serves is said too
            message = failed_load_words(models.last_error, [r.loaded.spec.id for r in residents])
    elif loading is not None:
        state, message = EngineState.LOADING, f"loading {loading.id}"
    elif models.last_error:
        state, message = EngineState.ERROR, models.last_error
    else:
        state, message = EngineState.UNLOADED, "no model loaded"
    return EngineStatus(state, message, loading, newest, tuple(entries), tuple(queue), memory)
