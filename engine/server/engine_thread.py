"""One thread owns the LLMEngine; HTTP handlers post commands and await their own queue.

The shape of llama.cpp's server (`server_queue` / `server_response`), not llama-cpp-python's
global lock: handlers never touch the engine. They post `add`/`abort`/`load`/`unload` commands to
a thread-safe queue; the loop drains it, runs `engine.step()` while anything is unfinished, and
hands each RequestOutput to its request's sink, which forwards it into the handler's
asyncio.Queue with `loop.call_soon_threadsafe`. When idle the loop blocks on the queue.
Model loading runs on this thread too, so a load never races a step.
"""
from __future__ import annotations

import concurrent.futures
import gc
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.server.metrics import Metrics

log = logging.getLogger(__name__)

Sink = Callable[[Any], None]  # receives a RequestOutput, or an exception that ends the request


class EngineUnavailable(RuntimeError):
    """No model is loaded (or it is loading, or the load failed)."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model from the store: what to load and the name clients call it by."""
    id: str
    path: str
    format: str = "gguf"
    name: str | None = None
    context_length: int | None = None


@dataclass(slots=True)
class LoadedModel:
    """What an engine factory returns: the engine plus the backend decision (shown on /health)."""
    spec: ModelSpec
    engine: Any  # LLMEngine
    backend: str
    device: str
    decision: dict = field(default_factory=dict)


EngineFactory = Callable[[ModelSpec], LoadedModel]


class EngineThread:
    """Owns the engine; `state` is unloaded | loading | ready | error, like llama.cpp's server_state."""

    def __init__(self, factory: EngineFactory, metrics: Metrics | None = None) -> None:
        self._factory = factory
        self.metrics = metrics or Metrics()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._loaded: LoadedModel | None = None
        self.state = "unloaded"
        self.message = "no model loaded"
        self.loading: ModelSpec | None = None
        self.stats = None  # EngineStats snapshot, refreshed by the loop after every change
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._started = False

    # ---- handler side (any thread) ---------------------------------------------------------
    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._commands.put(("stop",))
        if self._started:
            self._thread.join(timeout)

    @property
    def model(self) -> LoadedModel | None:
        return self._loaded if self.state == "ready" else None

    def submit_sink(self, prompt_ids: list[int], params, request_id: str, engine: Any, sink: Sink) -> None:
        """Queue a request for `engine` (the one its prompt was tokenized for); its outputs, or
        an exception that ends it, go to `sink` on the engine thread."""
        self._commands.put(("add", request_id, prompt_ids, params, engine, sink))

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def load(self, spec: ModelSpec) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.state, self.loading, self.message = "loading", spec, f"loading {spec.id}"
        self._commands.put(("load", spec, fut))
        return fut

    def unload(self) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(("unload", fut))
        return fut

    @property
    def num_requests(self) -> int:
        return len(self._sinks)

    # ---- the loop (engine thread) ----------------------------------------------------------
    def _run(self) -> None:
        while True:
            busy = self._loaded is not None and self._loaded.engine.has_unfinished()
            try:
                cmd = self._commands.get(block=not busy)  # idle: sleep until a command comes
            except queue.Empty:
                cmd = None
            while cmd is not None:
                if cmd[0] == "stop":
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

    def _handle(self, cmd: tuple) -> None:
        kind = cmd[0]
        if kind == "add":
            _, rid, ids, params, engine, sink = cmd
            if self._loaded is None or engine is not self._loaded.engine:
                sink(EngineUnavailable("the model was unloaded or switched; send the request again"))
                return
            try:
                engine.add_request(ids, params, request_id=rid)
            except Exception as e:  # a bad request the handler's checks missed: its error, not ours
                sink(e)
                return
            self._sinks[rid] = sink
        elif kind == "abort":
            if self._loaded is not None and cmd[1] in self._sinks:
                self._loaded.engine.abort(cmd[1])  # its final output arrives on the next step
                self.metrics.aborts.inc()
        elif kind == "load":
            self._load(cmd[1], cmd[2])
        elif kind == "unload":
            self._drop_model("the model was unloaded")
            self.state, self.message = "unloaded", "no model loaded"
            cmd[1].set_result(None)

    def _step(self) -> None:
        engine = self._loaded.engine
        t0 = time.perf_counter()
        try:
            outputs = engine.step()
        except Exception as e:
            log.exception("engine step failed; failing the requests in flight")
            self._fail_all(RuntimeError(f"the engine failed: {type(e).__name__}: {e}"))
            return
        dt = time.perf_counter() - t0
        new_tokens = 0
        for out in outputs:
            new_tokens += len(out.new_token_ids)
            sink = self._sinks.get(out.request_id)
            if out.finished:
                self._sinks.pop(out.request_id, None)
            if sink is not None:
                sink(out)
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
                self._drop_model("the engine failed")
                self.state, self.message = "error", f"the engine failed: {exc}"

    def _drop_model(self, why: str) -> None:
        if self._loaded is None:
            return
        for sink in self._sinks.values():
            sink(EngineUnavailable(why))
        self._sinks.clear()
        engine, self._loaded, self.stats = self._loaded.engine, None, None
        close = getattr(engine, "close", None)
        if callable(close):
            close()
        del engine
        gc.collect()

    def _load(self, spec: ModelSpec, fut: concurrent.futures.Future) -> None:
        self._drop_model(f"switching to {spec.id}")
        self.state, self.loading, self.message = "loading", spec, f"loading {spec.id}"
        t0 = time.perf_counter()
        try:
            loaded = self._factory(spec)
        except Exception as e:
            log.error("loading %s failed: %s", spec.id, e)
            self.state, self.loading = "error", None
            self.message = f"loading {spec.id} failed: {e}"
            fut.set_exception(e)
            return
        self._loaded, self.loading = loaded, None
        self.state, self.message = "ready", f"{spec.id} loaded in {time.perf_counter() - t0:.1f}s"
        log.info("%s ready on %s (%s): %s", spec.id, loaded.backend, loaded.device,
                 loaded.decision.get("reason", ""))
        fut.set_result(loaded)

    def _refresh_stats(self) -> None:
        if self._loaded is None:
            self.stats = None
            return
        try:
            self.stats = self._loaded.engine.stats()
        except Exception:
            log.exception("engine.stats() failed")
