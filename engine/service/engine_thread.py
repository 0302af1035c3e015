"""One thread owns the LLMEngine; HTTP handlers post commands and await their own queue.

The shape of llama.cpp's server (`server_queue` / `server_response`), not llama-cpp-python's
global lock: handlers never touch the engine. They post `Add`/`Abort`/`Load`/`Unload` commands to
a thread-safe queue; the loop drains it, runs `engine.step()` while anything is unfinished, and
hands each RequestOutput to its request's sink, which forwards it into the handler's
asyncio.Queue with `loop.call_soon_threadsafe`. When idle the loop blocks on the queue, after
trimming glibc's heap once it has been idle IDLE_TRIM_S (allocator.py).
Model loading runs on this thread too, so a load never races a step, and only this thread
writes the engine's state: it publishes one immutable `EngineStatus` that handlers read.
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
from engine.service.engine_commands import Abort, Add, Command, Load, Sink, Stop, Unload
from engine.service.handle import EngineState, EngineStatus, EngineUnavailable
from engine.service.metrics import Metrics
from engine.service.served_model import EngineFactory, LoadedModel, ModelSpec

if TYPE_CHECKING:
    from engine.llm_engine import EngineStats, LLMEngine

log = logging.getLogger(__name__)


class EngineThread:
    """Owns the engine. Handlers call the methods above the loop (handle.EngineHandle); only the
    loop writes state."""

    def __init__(self, factory: EngineFactory, metrics: Metrics | None = None,
                 check: Callable[[ModelSpec], None] = lambda _spec: None) -> None:
        self._factory = factory
        self._check = check  # reads a file before a load drops the model serving now; raises if it is unusable
        self.metrics = metrics or Metrics()
        self.trimmer = Trimmer()  # malloc_trim once idle (engine/service/allocator.py)
        self._trim_due = False  # steps, a load or an unload ran since the last trim
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._loaded: LoadedModel | None = None
        self._status = EngineStatus(EngineState.UNLOADED, "no model loaded")
        self._last_load: Load | None = None  # the newest load posted (handler side)
        self.stats: EngineStats | None = None  # snapshot, refreshed by the loop after every change
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
        """The loop's status; LOADING from the moment a load is posted, before the loop takes it
        (so that /health never shows the old state for a queued load)."""
        load = self._last_load
        if load is not None and not (load.future.running() or load.future.done()):
            return EngineStatus(EngineState.LOADING, f"loading {load.spec.id}", load.spec)
        return self._status  # read after the future: the loop writes it before starting one

    # status's fields, one snapshot each
    state = property(lambda self: self.status.state)
    message = property(lambda self: self.status.message)
    loading = property(lambda self: self.status.loading)
    model = property(lambda self: self.status.model)

    def submit_sink(self, prompt_ids: list[int], params: SamplingParams, request_id: str,
                    engine: LLMEngine, sink: Sink) -> None:
        """Queue a request for `engine` (the one its prompt was tokenized for); its outputs, or
        an exception that ends it, go to `sink` on the engine thread."""
        self._commands.put(Add(request_id, prompt_ids, params, engine, sink))

    def abort(self, request_id: str) -> None:
        self._commands.put(Abort(request_id))

    def load(self, spec: ModelSpec) -> concurrent.futures.Future:
        cmd = Load(spec, concurrent.futures.Future())
        self._last_load = cmd
        self._commands.put(cmd)
        return cmd.future

    def unload(self) -> concurrent.futures.Future:
        cmd = Unload(concurrent.futures.Future())
        self._commands.put(cmd)
        return cmd.future

    @property
    def num_requests(self) -> int:
        return len(self._sinks)

    # ---- the loop (engine thread) ----------------------------------------------------------
    def _run(self) -> None:
        while True:
            busy = self._loaded is not None and self._loaded.engine.has_unfinished()
            try:  # idle: sleep until a command comes (after a short wait, trim the heap first)
                cmd = self._commands.get(block=not busy, timeout=IDLE_TRIM_S if self._trim_due else None)
            except queue.Empty:
                cmd = None
                if self._trim_due and not busy:  # idle a moment: give glibc's free pages back
                    self.trimmer.trim()
                    self._trim_due = False
            while cmd is not None:
                if isinstance(cmd, Stop):
                    self._drop_model("the server is shutting down")
                    return
                self._handle(cmd)
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    cmd = None
            if self._loaded is not None and self._loaded.engine.has_unfinished():
                self._step()
            self._refresh_stats()

    def _handle(self, cmd: Command) -> None:
        match cmd:
            case Add(rid, ids, params, engine, sink):
                if self._loaded is None or engine is not self._loaded.engine:
                    sink(EngineUnavailable("the model was unloaded or switched; send the request again"))
                    return
                try:
                    engine.add_request(ids, params, request_id=rid)
                except Exception as e:  # a bad request the handler's checks missed: its error, not ours
                    sink(e)
                    return
                self._sinks[rid] = sink
            case Abort(rid):
                if self._loaded is not None and rid in self._sinks:
                    self._loaded.engine.abort(rid)  # its final output arrives on the next step
                    self.metrics.aborts.inc()
            case Load(spec, fut):
                self._load(spec, fut)
            case Unload(fut):
                waited = fut.set_running_or_notify_cancel()  # False: its caller went away
                self._status = EngineStatus(EngineState.UNLOADED, "no model loaded")
                self._drop_model("the model was unloaded")
                if waited:
                    fut.set_result(None)

    def _step(self) -> None:
        engine = self._loaded.engine
        self._trim_due = self.trimmer.enabled
        t0 = time.perf_counter()
        try:
            outputs = engine.step()
        except Exception as e:
            log.exception("engine step failed; failing the requests in flight")
            self._fail_all(RuntimeError(f"the engine failed: {type(e).__name__}: {e}"))
            return
        dt = time.perf_counter() - t0
        for out in outputs:
            sink = (self._sinks.pop if out.finished else self._sinks.get)(out.request_id, None)
            if sink is not None:
                sink(out)
        new_tokens = sum(len(out.new_token_ids) for out in outputs)
        self.metrics.on_step(batch_size=len(outputs), new_tokens=new_tokens, seconds=dt)

    def _fail_all(self, exc: BaseException) -> None:
        engine = self._loaded.engine if self._loaded else None
        for rid, sink in list(self._sinks.items()):
            if engine is not None:
                try:
                    engine.abort(rid)
                except Exception:
                    log.exception("abort of %s failed", rid)
            sink(exc)
        self._sinks.clear()
        if engine is not None:
            try:  # collect the aborts so the engine holds nothing afterwards
                while engine.has_unfinished():
                    engine.step()
            except Exception:
                log.exception("the engine could not drain its aborted requests; dropping it")
                self._status = EngineStatus(EngineState.ERROR, f"the engine failed: {exc}")
                self._drop_model("the engine failed")

    def _drop_model(self, why: str) -> None:
        if self._loaded is None:
            return
        for sink in self._sinks.values():
            sink(EngineUnavailable(why))
        self._sinks.clear()
        engine, self._loaded, self.stats = self._loaded.engine, None, None
        engine.close()  # the runner's model and KV now, not whenever the collector runs
        del engine
        gc.collect()
        self._trim_due = self.trimmer.enabled

    def _load(self, spec: ModelSpec, fut: concurrent.futures.Future) -> None:
        """Load `spec` in place of the model loaded now (both rarely fit in memory at once). A load
        that fails for any reason loads the previous model again, so what worked keeps serving."""
        self._status = EngineStatus(EngineState.LOADING, f"loading {spec.id}", spec)
        waited = fut.set_running_or_notify_cancel()  # False: its caller went away; load anyway
        previous = self._loaded.spec if self._loaded is not None else None
        try:
            self._check(spec)  # a damaged file is refused while the model that serves keeps serving
        except Exception as e:
            log.error("not loading %s: %s", spec.id, e)
            kept = self._loaded
            self._status = (EngineStatus(EngineState.READY, f"loading {spec.id} failed: {e}; "
                                         f"{kept.spec.id} is still loaded", model=kept) if kept is not None
                            else EngineStatus(EngineState.ERROR, f"loading {spec.id} failed: {e}"))
            if waited:
                fut.set_exception(e)
            return
        self._drop_model(f"switching to {spec.id}")
        t0 = time.perf_counter()
        try:
            loaded = self._factory(spec)
        except Exception as e:
            log.error("loading %s failed: %s", spec.id, e)
            failed = f"loading {spec.id} failed: {e}"
            self._status = EngineStatus(EngineState.ERROR, failed)
            if previous is not None and previous.path != spec.path:
                self._restore(previous, failed)
            if waited:
                fut.set_exception(e)
            return
        self._loaded, self._trim_due = loaded, self.trimmer.enabled  # a load frees its temporaries
        self._status = EngineStatus(EngineState.READY, f"{spec.id} loaded in {time.perf_counter() - t0:.1f}s",
                                    model=loaded)
        log.info("%s ready on %s (%s): %s", spec.id, loaded.backend, loaded.device,
                 loaded.decision.get("reason", ""))
        if waited:
            fut.set_result(loaded)

    def _restore(self, previous: ModelSpec, failed: str) -> None:
        """The model that served before a failed load, loaded again; /health says both."""
        try:
            loaded = self._factory(previous)
        except Exception as e:  # it loaded before: the machine changed under it (memory, file)
            log.error("reloading %s after the failed load failed too: %s", previous.id, e)
            self._status = EngineStatus(EngineState.ERROR, f"{failed}; reloading {previous.id} failed: {e}")
            return
        self._loaded, self._trim_due = loaded, self.trimmer.enabled
        self._status = EngineStatus(EngineState.READY, f"{failed}; {previous.id} is loaded again", model=loaded)
        log.info("%s loaded again after the failed load", previous.id)

    def _refresh_stats(self) -> None:
        if self._loaded is None:
            self.stats = None
            return
        try:
            self.stats = self._loaded.engine.stats()
        except Exception:
            log.exception("engine.stats() failed")
