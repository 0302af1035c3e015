"""One thread owns the resident LLMEngines; HTTP handlers post commands and await their own queue.

The shape of llama.cpp's server (`server_queue` / `server_response`), not llama-cpp-python's
global lock: handlers never touch an engine. They post commands to a thread-safe queue; the loop
drains it, steps the busy model that has had the least engine time (an even share each, as a
fair-share scheduler gives processes), and hands each RequestOutput to its request's sink, which
forwards it into the handler's asyncio.Queue with `loop.call_soon_threadsafe`. Several models are resident at once (model_set.py decides which,
residency.py's budget): one thread steps them all, because on a CPU each step already uses every
core (a thread per model would only make two models' steps fight over the same cores). Loads run on
a loader thread, so the models already loaded keep streaming while the next one loads. When idle
the loop blocks on the queue (waking for the next keep-alive expiry), after trimming glibc's heap
once it has been idle IDLE_TRIM_S (allocator.py). Only this thread writes the engines' state: it
publishes one immutable `EngineStatus` that handlers read.
"""
from __future__ import annotations

import concurrent.futures
import gc
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.sampling_params import SamplingParams
from engine.service.allocator import IDLE_TRIM_S, Trimmer
from engine.service.engine_commands import Abort, Acquire, Add, Command, Loaded, Release, Sink, Stop, Unload
from engine.service.handle import KEEP_DEFAULT, EngineStatus, EngineUnavailable
from engine.service.metrics import Metrics
from engine.service.model_set import ModelSet
from engine.service.residency import Resident, ResidencyConfig, rss_bytes
from engine.service.served_model import EngineFactory, LoadedModel, ModelSpec
from engine.service.status_snapshot import snapshot

if TYPE_CHECKING:
    from engine.llm_engine import EngineStats, LLMEngine

log = logging.getLogger(__name__)


class EngineThread:
    """Owns the engines. Handlers call the methods above the loop (handle.EngineHandle); only the
    loop writes state. `factory(spec, kv_cache_max_bytes=...)` loads a model (on the loader thread),
    `check(spec)` refuses a damaged file in milliseconds, `estimate(spec)` is the bytes it will take,
    `fits_now(n)` whether the machine has n bytes free right now."""

    def __init__(self, factory: EngineFactory, metrics: Metrics | None = None,
                 check: Callable[[ModelSpec], None] = lambda _spec: None,
                 residency: ResidencyConfig | None = None, estimate: Callable[[ModelSpec], int] = lambda _s: 0,
                 fits_now: Callable[[int], bool] = lambda _n: False) -> None:
        self._factory, self._check = factory, check
        self.residency = residency or ResidencyConfig()
        self.metrics = metrics or Metrics()
        self.trimmer = Trimmer()  # malloc_trim once idle (engine/service/allocator.py)
        self._trim_due = False  # steps, a load or an unload ran since the last trim
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._owner: dict[str, Resident] = {}  # request id -> the model it runs on
        self._set = ModelSet(self.residency, estimate, self._start_load, self._close, fits_now)
        self._loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="loader")
        self._load_started: dict[str, float] = {}
        self._loaded_msg: str | None = None
        self._untaken: dict[int, ModelSpec] = {}  # acquires posted, not yet taken by the loop
        self._status = snapshot(self._set, "no model loaded")
        self.stats: EngineStats | None = None  # the newest model's, refreshed by the loop
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._started = False

    # ---- handler side (any thread) ---------------------------------------------------------
    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._commands.put(Stop())
        if self._started:
            self._thread.join(timeout)

    @property
    def status(self) -> EngineStatus:
        """The loop's status; LOADING from the moment a load is posted while nothing serves yet
        (so that /health never shows "unloaded" for a queued load)."""
        status = self._status
        pending = next(iter(list(self._untaken.values())), None)  # a copy: the loop pops from it meanwhile
        if pending is not None and status.model is None and status.state != "loading":
            return EngineStatus("loading", f"loading {pending.id}", pending, memory=status.memory)
        return status

    # status's fields, one snapshot each
    state = property(lambda self: self.status.state)
    message = property(lambda self: self.status.message)
    loading = property(lambda self: self.status.loading)
    model = property(lambda self: self.status.model)
    models = property(lambda self: self.status.models)

    def submit_sink(self, prompt_ids: list[int], params: SamplingParams, request_id: str,
                    engine: LLMEngine, sink: Sink, images: list | None = None) -> None:
        """Queue a request for `engine` (the one its prompt was tokenized for); its outputs, or
        an exception that ends it, go to `sink` on the engine thread; `images`: its image spans."""
        self._commands.put(Add(request_id, prompt_ids, params, engine, sink, images or []))

    def abort(self, request_id: str) -> None:
        self._commands.put(Abort(request_id))

    def acquire(self, spec: ModelSpec, keep_alive_s=KEEP_DEFAULT) -> concurrent.futures.Future:
        """A future of `spec`'s LoadedModel, held (never unloaded) until `release(spec.id)`;
        cancel it to stop waiting. `keep_alive_s`: how long it stays once idle (None: it stays)."""
        cmd = Acquire(spec, keep_alive_s, concurrent.futures.Future())
        self._untaken[id(cmd)] = spec
        self._commands.put(cmd)
        return cmd.future

    def release(self, model_id: str) -> None:
        self._commands.put(Release(model_id))

    def load(self, spec: ModelSpec, keep_alive_s: float | None = None) -> concurrent.futures.Future:
        """Make `spec` resident beside the others (it stays until unloaded, unless memory is
        short or `keep_alive_s` says otherwise); the future resolves to its LoadedModel."""
        fut = self.acquire(spec, keep_alive_s)
        fut.add_done_callback(lambda f: f.cancelled() or f.exception() or self.release(spec.id))
        return fut

    def unload(self, model_id: str | None = None) -> concurrent.futures.Future:
        """Unload one model (None: all) now, or once its running replies end."""
        cmd = Unload(model_id, concurrent.futures.Future())
        self._commands.put(cmd)
        return cmd.future

    @property
    def num_requests(self) -> int:
        return len(self._sinks)

    # ---- the loop (engine thread) ----------------------------------------------------------
    def _run(self) -> None:
        next_expiry = None
        while True:
            busy = any(r.loaded.engine.has_unfinished() for r in self._set.residents.values())
            waits = [t for t in (IDLE_TRIM_S if self._trim_due else None, next_expiry) if t is not None]
            try:  # idle: sleep until a command comes, the heap wants trimming or a model expires
                cmd = self._commands.get(block=not busy, timeout=min(waits) if waits else None)
            except queue.Empty:
                cmd = None
                if self._trim_due and not busy:  # idle a moment: give glibc's free pages back
                    self.trimmer.trim()
                    self._trim_due = False
            while cmd is not None:
                if isinstance(cmd, Stop):
                    self._shutdown()
                    return
                self._handle(cmd)
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    cmd = None
            next_expiry = self._set.expire(time.time())
            if self._set.settled:
                self._publish()
                self._settle()
            r = self._set.next_to_step()  # the busy model that has had the least engine time
            if r is not None:
                self._step(r)
            self._publish()

    def _handle(self, cmd: Command) -> None:
        match cmd:
            case Add(rid, ids, params, engine, sink, images):
                r = self._set.by_engine(engine)
                if r is None:
                    sink(EngineUnavailable("the model was unloaded; send the request again"))
                    return
                try:
                    engine.add_request(ids, params, request_id=rid, images=images)
                except Exception as e:  # a bad request the handler's checks missed: its error, not ours
                    sink(e)
                    return
                self._sinks[rid], self._owner[rid] = sink, r
                r.requests.add(rid)
            case Abort(rid):
                r = self._owner.get(rid)
                if r is not None and rid in self._sinks:
                    r.loaded.engine.abort(rid)  # its final output arrives on the next step
                    self.metrics.aborts.inc()
            case Acquire(spec, keep, fut):
                self._untaken.pop(id(cmd), None)
                self._set.acquire(spec, keep, fut, self._check)
            case Release(mid):
                self._set.release(mid)
            case Loaded(spec, result):
                self._on_loaded(spec, result)
            case Unload(mid, fut):
                self._set.unload(mid)
                if fut.set_running_or_notify_cancel():
                    self._set.settled.append((fut, None))

    def _step(self, r: Resident) -> None:
        engine = r.loaded.engine
        self._trim_due = self.trimmer.enabled
        t0 = time.perf_counter()
        try:
            outputs = engine.step()
        except Exception as e:
            log.exception("engine step of %s failed; failing its requests in flight", r.loaded.spec.id)
            self._fail(r, RuntimeError(f"the engine failed: {type(e).__name__}: {e}"))
            return
        dt = time.perf_counter() - t0
        r.engine_time += dt
        for out in outputs:
            if out.finished:
                sink = self._sinks.pop(out.request_id, None)
                self._owner.pop(out.request_id, None)
                r.requests.discard(out.request_id)
            else:
                sink = self._sinks.get(out.request_id)
            if sink is not None:
                sink(out)
        self._set.touch(r)
        self.metrics.on_step(batch_size=len(outputs), new_tokens=sum(len(o.new_token_ids) for o in outputs), seconds=dt)

    def _fail(self, r: Resident, exc: BaseException) -> None:
        """`r`'s requests end with `exc`; its engine drains them, or is unloaded if it cannot."""
        engine = r.loaded.engine
        for rid in list(r.requests):
            try:
                engine.abort(rid)
            except Exception:
                log.exception("abort of %s failed", rid)
            self._end(rid, exc)
        try:  # collect the aborts so the engine holds nothing afterwards
            while engine.has_unfinished():
                engine.step()
        except Exception:
            log.exception("the engine of %s could not drain its aborted requests; dropping it", r.loaded.spec.id)
            self._set.drop(r.loaded.spec.id, f"the engine failed: {exc}")

    def _end(self, rid: str, exc: BaseException) -> None:
        sink = self._sinks.pop(rid, None)
        r = self._owner.pop(rid, None)
        if r is not None:
            r.requests.discard(rid)
        if sink is not None:
            sink(exc)

    def _close(self, r: Resident, why: str) -> None:
        """Unload `r` now (model_set.py chose it): its requests end with `why`, its memory goes."""
        for rid in list(r.requests):
            self._end(rid, EngineUnavailable(why))
        r.loaded.engine.close()  # the runner's model and KV now, not whenever the collector runs
        gc.collect()
        self._trim_due = self.trimmer.enabled

    def _start_load(self, spec: ModelSpec, kv_cap: int) -> None:
        self._load_started[spec.id] = time.perf_counter()

        def load() -> None:  # the loader thread
            try:
                result = self._factory(spec, kv_cache_max_bytes=kv_cap or None)
            except BaseException as e:  # noqa: BLE001 - every failure goes back to the waiters
                log.error("loading %s failed: %s", spec.id, e)
                result = e
            self._commands.put(Loaded(spec, result))
        self._loader.submit(load)

    def _on_loaded(self, spec: ModelSpec, result: LoadedModel | BaseException) -> None:
        dt = time.perf_counter() - self._load_started.pop(spec.id, time.perf_counter())
        nbytes = 0
        if isinstance(result, LoadedModel):
            nbytes = result.memory_bytes
            self._loaded_msg = f"{spec.id} loaded in {dt:.1f}s"
            log.info("%s ready on %s (%s): %s", spec.id, result.backend, result.device,
                     result.decision.get("reason", ""))
        self._set.loaded(spec, result, nbytes)
        self._trim_due = self.trimmer.enabled  # a load frees its temporaries
        if isinstance(result, LoadedModel):  # the budget's count, checked against what the process holds
            counted = sum(r.bytes for r in self._set.residents.values())
            log.info("resident: %s; the budget counts %.0f MiB of %.0f MiB, the process holds %.0f MiB (RSS)",
                     ", ".join(self._set.residents), counted / 2**20, self.residency.budget / 2**20, rss_bytes() / 2**20)

    def _publish(self) -> None:
        self._status = status = snapshot(self._set, self._loaded_msg or "no model loaded")
        self.stats = status.models[0].stats if status.model is not None else None  # the newest's, read once

    def _settle(self) -> None:
        settled, self._set.settled = self._set.settled, []
        for fut, value in settled:
            if isinstance(value, BaseException):
                fut.set_exception(value)
            else:
                fut.set_result(value)

    def _shutdown(self) -> None:
        for mid in list(self._set.residents):
            self._set.drop(mid, "the server is shutting down")
        self._settle()
        self._loader.shutdown(wait=False, cancel_futures=True)
