"""The resident models and the loads waiting for memory: the engine thread's bookkeeping of several
models at once, residency.py's rule applied. Only the engine thread calls it.

A request *acquires* its model (a future that resolves once the model is resident, holding it) and
*releases* it when its stream ends. A model not resident is loaded just in time: the loads wait in
one first-come queue, and the head starts when it fits the budget, after unloading idle models
least recently used first; while every model in the way is busy it waits (its position is on the
status). One load runs at a time, on the loader (engine_thread.py), never on the engine thread, so
the replies of the models already loaded keep streaming while it loads.
"""
from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.service.handle import KEEP_DEFAULT
from engine.service.residency import Resident, ResidencyConfig, evictions
from engine.service.served_model import LoadedModel, ModelSpec

log = logging.getLogger(__name__)


class QueueFull(RuntimeError):
    """Too many requests wait for memory already; the server answers 503 with Retry-After."""


class DoesNotFit(MemoryError):
    """The model alone is larger than the memory budget: no amount of waiting makes it fit."""


@dataclass(slots=True)
class PendingLoad:
    """A model some requests wait for: queued for memory, or loading."""
    spec: ModelSpec
    need: int  # bytes the budget counts for it (the estimate until it has loaded)
    since: float
    waiters: list[tuple[concurrent.futures.Future, float | None]] = field(default_factory=list)
    loading: bool = False
    then_evict: list[str] = field(default_factory=list)  # idle models to unload once it has loaded

    def live(self) -> bool:
        self.waiters = [(f, k) for f, k in self.waiters if not f.cancelled()]
        return bool(self.waiters)


class ModelSet:
    """`estimate(spec)` is the bytes a model will take, `start_load(spec, kv_cap)` begins a load in
    the background (its end comes back as `loaded`), `close(resident, why)` unloads one now,
    `fits_now(bytes)` says whether the machine has that much free beside what is loaded."""

    def __init__(self, cfg: ResidencyConfig, estimate: Callable[[ModelSpec], int],
                 start_load: Callable[[ModelSpec, int], None], close: Callable[[Resident, str], None],
                 fits_now: Callable[[int], bool] = lambda _n: False) -> None:
        self.cfg = cfg
        self.residents: dict[str, Resident] = {}
        self.pending: dict[str, PendingLoad] = {}  # insertion order is the queue's order
        self.last_error: str | None = None  # the newest failed load, in words
        # futures decided (running) but not yet given their result or exception: the engine thread
        # settles them after publishing its status, so a waiter that wakes reads a status that
        # already says what its future says
        self.settled: list[tuple[concurrent.futures.Future, object]] = []
        self._time_floor = 0.0  # the least engine time among busy models (next_to_step)
        self._estimate, self._start_load, self._close, self._fits_now = estimate, start_load, close, fits_now

    # ---- requests ---------------------------------------------------------------------------
    def acquire(self, spec: ModelSpec, keep_alive_s, fut: concurrent.futures.Future,
                check: Callable[[ModelSpec], None]) -> None:
        r = self.residents.get(spec.id)
        if r is not None and r.loaded.spec != spec and not r.busy:  # its file or load settings changed
            self.drop(spec.id, f"reloading {spec.id} with its new settings")
            r = None
        if r is not None:
            if fut.set_running_or_notify_cancel():
                self._hold(r, keep_alive_s)
                self.settled.append((fut, r.loaded))
            return
        p = self.pending.get(spec.id)
        if p is None:
            try:
                p = self._queue(spec, check)
            except Exception as e:  # refused in words: a damaged file, over the budget, a full queue
                if fut.set_running_or_notify_cancel():
                    self.settled.append((fut, e))
                return
        p.waiters.append((fut, keep_alive_s))
        self.admit()

    def _queue(self, spec: ModelSpec, check: Callable[[ModelSpec], None]) -> PendingLoad:
        waiting = sum(len(p.waiters) for p in self.pending.values())
        if waiting >= self.cfg.max_queue:
            raise QueueFull(f"{waiting} requests are waiting for memory already; try again later")
        try:
            check(spec)  # a damaged file is refused before anything is unloaded for it
        except Exception as e:
            self.last_error = f"loading {spec.id} failed: {e}"
            log.error("not loading %s: %s", spec.id, e)
            raise
        need = self._estimate(spec)
        if need > self.cfg.budget:
            raise DoesNotFit(f"{spec.id} needs about {need / 2**30:.1f} GiB, more than the whole memory "
                             f"budget ({self.cfg.budget / 2**30:.1f} GiB); raise it in Settings → Engine (--memory-budget)")
        p = self.pending[spec.id] = PendingLoad(spec, need, time.monotonic())
        return p

    def release(self, model_id: str) -> None:
        r = self.residents.get(model_id)
        if r is not None:
            r.holds = max(r.holds - 1, 0)
            self.touch(r)

    def touch(self, r: Resident) -> None:
        """After a request let go of `r`: once idle its keep-alive starts, and a queued load may fit."""
        if not r.busy:
            r.idle_since(time.monotonic(), time.time())
            self.admit()

    def _hold(self, r: Resident, keep_alive_s) -> None:
        """A request holds `r`; a keep-alive it names replaces the model's (KEEP_DEFAULT keeps it)."""
        r.holds += 1
        r.expires_at, r.last_used = None, time.monotonic()
        if keep_alive_s is not KEEP_DEFAULT:
            r.keep_alive_s = keep_alive_s

    # ---- loads ------------------------------------------------------------------------------
    def admit(self) -> None:
        """Start the queue's head if it fits (unloading idle models for it); else it waits."""
        if any(p.loading for p in self.pending.values()):
            return  # one load at a time: two on two cores only slow each other
        for mid, p in list(self.pending.items()):
            if not p.live():
                del self.pending[mid]
                continue
            out = evictions(self.residents, p.need, self.cfg)
            if out is None:
                return  # first come, first served: the ones behind it wait too
            # a load is checked and made before anything is unloaded for it, when the machine
            # has the room for a moment; otherwise its idle predecessors go first
            if out and not self._fits_now(p.need):
                for victim in out:
                    self.drop(victim, f"unloaded to make room for {mid}")
                out = []
            p.loading, p.then_evict = True, out
            self._start_load(p.spec, self.cfg.kv_cap_bytes(p.need))
            return

    def loaded(self, spec: ModelSpec, result: LoadedModel | BaseException, nbytes: int = 0) -> None:
        """A load ended: its waiters get the model (held for them) or the error."""
        p = self.pending.pop(spec.id)
        if isinstance(result, BaseException):
            self.last_error = f"loading {spec.id} failed: {result}"
            for fut, _ in p.waiters:
                if fut.set_running_or_notify_cancel():
                    self.settled.append((fut, result))
        else:
            self.last_error = None
            r = self.residents[spec.id] = Resident(result, nbytes or p.need, time.monotonic(),
                                                   keep_alive_s=self.cfg.keep_alive_s)
            for victim in p.then_evict:
                victim_r = self.residents.get(victim)
                if victim_r is not None and not victim_r.busy:
                    self.drop(victim, f"unloaded to make room for {spec.id}")
            for fut, keep_alive_s in p.waiters:
                if fut.set_running_or_notify_cancel():
                    self._hold(r, keep_alive_s)
                    self.settled.append((fut, result))
            self.touch(r)
        self.admit()

    # ---- unloading --------------------------------------------------------------------------
    def drop(self, model_id: str, why: str) -> None:
        r = self.residents.pop(model_id, None)
        if r is not None:
            log.info("%s: %s", model_id, why)
            self._close(r, why)

    def unload(self, model_id: str | None) -> None:
        """Unload now, or (a model with replies running) as soon as they end: nothing is cut.
        Unloading every model also forgets the last failed load: the state is "unloaded" again."""
        if model_id is None:
            self.last_error = None
        for mid in [model_id] if model_id else list(self.residents):
            r = self.residents.get(mid)
            if r is None:
                continue
            r.keep_alive_s = 0.0
            if not r.busy:
                self.drop(mid, "unloaded")
        self.admit()

    def expire(self, wall: float) -> float | None:
        """Unload the idle models whose keep-alive ran out; the seconds to the next expiry."""
        nxt, dropped = None, False
        for mid, r in list(self.residents.items()):
            if r.busy or r.expires_at is None:
                continue
            if r.expires_at <= wall:
                self.drop(mid, "idle past its keep-alive")
                dropped = True
            else:
                nxt = min(nxt if nxt is not None else float("inf"), r.expires_at - wall)
        if dropped:
            self.admit()
        return nxt

    def next_to_step(self) -> Resident | None:
        """The busy model with the least engine time, so that busy models share the thread's time
        evenly (a small model then makes its tokens at its own pace, not at a large one's). A model
        that was idle is first brought up to the least time of the others (the `floor`, as a
        fair-share scheduler's min_vruntime), so its idle past buys it no burst. Background work
        (a warm) runs only while no model has a request."""
        busy = [r for r in self.residents.values() if r.loaded.engine.has_unfinished()]
        busy = [r for r in busy if r.loaded.engine.scheduler.has_foreground()] or busy
        if not busy:
            return None
        for r in busy:
            r.engine_time = max(r.engine_time, self._time_floor)
        nxt = min(busy, key=lambda r: r.engine_time)
        self._time_floor = nxt.engine_time
        return nxt

    def by_engine(self, engine) -> Resident | None:
        return next((r for r in self.residents.values() if r.loaded.engine is engine), None)
