"""EngineSupervisor: keeps the desktop app's engine process alive; its policy, not its mechanics.

Spawning, the ready file, the log and stopping are app/engine_process.py's; the child's arguments
come from the settings through `engine_args`. A watcher thread starts the child, follows `/health`
(loading -> ready), restarts the child when it dies (backoff 0.5 s doubling to 8 s; more than
`max_restarts` deaths within `restart_window` seconds is a crash loop and ends in ERROR), and
stops it on request. Qt-free: state changes go to callbacks, called from whichever thread
changed the state (mostly the watcher). The child's output goes to `<data_dir>/logs/engine.log`.
"""
from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from enum import StrEnum
from pathlib import Path

from app.client import EngineClient, EngineClientError
from app.engine_process import EngineProcess, connect_url, engine_args, to_argv
from app.settings import Settings
from app.store import ModelStore
from engine.model_files.architectures import embeds_only

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class SupervisorState(StrEnum):
    """The supervised engine's state; str-valued, so callbacks and Qt signals carry plain names."""

    STOPPED = "stopped"  # never started, or stopped on request
    STARTING = "starting"  # spawned and loading, or restarting after a crash
    READY = "ready"  # serving (a model, or none after /v1/engine/unload)
    CRASHED = "crashed"  # died unexpectedly; restarts after a backoff
    ERROR = "error"  # a crash loop, a spawn failure, or a model that failed to load


class EngineSupervisor:
    def __init__(self, settings: Settings, model_id: str | None = None, model_path: str | Path | None = None, *,
                 port: int | None = None, startup_timeout: float = 300.0, load_timeout: float = 900.0,
                 max_restarts: int = 5, restart_window: float = 120.0, backoff: tuple[float, float] = (0.5, 8.0),
                 grace: float = 5.0, extra_args: Sequence[str] = ()) -> None:
        if model_id and model_path:
            raise ValueError("give model_id or model_path, not both")
        self.settings = settings
        self.model_id = None if model_path else (model_id or settings.default_model)
        self.model_path = Path(model_path) if model_path else None
        self.api_key = settings.api_key
        self.startup_timeout, self.load_timeout = startup_timeout, load_timeout
        self.max_restarts, self.restart_window, self.backoff, self.grace = max_restarts, restart_window, backoff, grace
        self.extra_args = list(extra_args)
        self.log_path = settings.logs_dir / "engine.log"
        self._port = port  # None: settings.server_port, read at each start
        self._orig_path, self._path_model = self.model_path, None  # the file given, and the id the engine gave it
        self._ready_file = settings.data_dir / "run" / f"engine-{os.getpid()}-{id(self):x}.json"
        self._state, self.message = SupervisorState.STOPPED, ""
        self.port: int | None = None
        self.restarts = 0  # unexpected deaths followed by a restart, over this object's life
        self._callbacks: list[Callable[[SupervisorState], None]] = []
        self._cond = threading.Condition()
        self._lock = threading.Lock()  # guards _proc and the stop flag against spawn/stop races
        self._proc: EngineProcess | None = None  # the running child
        self._last: EngineProcess | None = None  # the latest child, whose log tail errors quote
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        ref = weakref.ref(self)
        atexit.register(lambda: (s := ref()) is not None and s._kill_child())

    # ---- public state ----
    @property
    def state(self) -> SupervisorState:
        return self._state

    @property
    def base_url(self) -> str | None:
        if self.port is None or self._state is SupervisorState.STOPPED:
            return None
        return connect_url(self.settings.server_host, self.port)

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def log_tail(self) -> str:
        """The end of what the latest child wrote ("" before the first start)."""
        return self._last.log_tail() if self._last is not None else ""

    def on_state_change(self, callback: Callable[[SupervisorState], None]) -> Callable[[], None]:
        """`callback(state)` when the state or its message changes (mostly from the watcher thread);
        read `.message` for the detail. Returns an unsubscribe function."""
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback) if callback in self._callbacks else None

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until READY (True) or ERROR/STOPPED/timeout (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._state is not SupervisorState.READY:
                if self._state in (SupervisorState.ERROR, SupervisorState.STOPPED):
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(0.2 if left is None else min(left, 0.2))
            return True

    # ---- control ----
    def start(self) -> None:
        """Start the engine (non-blocking); a no-op while it is already supervised."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._set(SupervisorState.STARTING, "starting the engine")
        self._thread = threading.Thread(target=self._watch_loop, name="engine-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the engine and the watcher (blocking, at most about `grace` seconds plus a kill)."""
        with self._lock:
            self._stop.set()
        self._kill_child()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.grace + 10)
        self.port = None
        self._set(SupervisorState.STOPPED, "")

    def restart(self) -> None:
        """Stop and start again (on purpose: not counted as a crash)."""
        self.stop()
        self.start()

    # ---- the watcher thread ----
    def _watch_loop(self) -> None:
        deaths: deque[float] = deque()
        while not self._stop.is_set():
            try:
                proc = self._spawn()
            except OSError as e:
                self._set(SupervisorState.ERROR, f"cannot start the engine: {e}")
                return
            if proc is None:  # stop() came first
                return
            reason = self._follow(proc)
            if self._stop.is_set():
                return
            self._kill_child()
            now = time.monotonic()
            deaths.append(now)
            while deaths and now - deaths[0] > self.restart_window:
                deaths.popleft()
            detail = f"{reason}{proc.log_tail()}"
            if len(deaths) > self.max_restarts:
                self._set(SupervisorState.ERROR, f"the engine keeps failing ({len(deaths)} times in "
                                             f"{self.restart_window:.0f} s); last: {detail}")
                return
            delay = min(self.backoff[0] * 2 ** (len(deaths) - 1), self.backoff[1])
            log.warning("engine died (%s); restarting in %.1f s", reason, delay)
            self._set(SupervisorState.CRASHED, f"{detail}\nrestarting in {delay:.1f} s")
            if self._stop.wait(delay):
                return
            self.restarts += 1
            self._set(SupervisorState.STARTING, "restarting the engine")

    def _follow(self, proc: EngineProcess) -> str:
        """Watch one child until it dies or is stopped; returns why it ended."""
        t0 = time.monotonic()
        client: EngineClient | None = None
        ever_ready = False
        try:
            while not self._stop.is_set():
                rc = proc.poll()
                if rc is not None:
                    return f"the engine exited with code {rc}"
                if client is None:
                    port = proc.read_port()
                    if port is not None:
                        self.port = port  # kept from the last child until then: base_url stays usable
                        client = EngineClient(self.base_url, api_key=self.api_key, timeout=2.0)
                    elif time.monotonic() - t0 > self.startup_timeout:
                        return f"the engine did not start listening within {self.startup_timeout:.0f} s"
                    else:
                        self._stop.wait(0.05)
                        continue
                try:
                    health = client.health()
                except EngineClientError as e:
                    health = {"status": "unreachable", "message": str(e)}
                status, message = health.get("status"), str(health.get("message") or "")
                if status in ("ready", "unloaded"):  # unloaded: serving, no model (after /v1/engine/unload)
                    ever_ready = True
                    self._track_model(health.get("model"))
                    self._set(SupervisorState.READY, f"serving {health.get('model') or 'no model'} at {self.base_url}")
                elif status == "loading":
                    self._set(SupervisorState.STARTING, message or "loading the model")
                    if not ever_ready and time.monotonic() - t0 > self.load_timeout:
                        return f"the model did not load within {self.load_timeout:.0f} s"
                elif status == "error":
                    self._set(SupervisorState.ERROR, message or "the engine reported an error")
                elif not ever_ready and time.monotonic() - t0 > self.startup_timeout:
                    return f"the engine did not answer /health within {self.startup_timeout:.0f} s ({message})"
                self._stop.wait(1.0 if self._state in (SupervisorState.READY, SupervisorState.ERROR) else 0.1)
            return "stopped"
        finally:
            if client is not None:
                client.close()

    def _engine(self, port: int) -> EngineProcess:
        """The child of one (re)start: the settings' engine arguments with this supervisor's model."""
        args = {**engine_args(self.settings), **self._model_args(),
                # set explicitly in the settings, and a key is always set
                "allow_remote": self.settings.server_host not in LOOPBACK}
        del args["port"], args["api_key"]  # the launcher's --port; the key goes in the environment
        return EngineProcess([*to_argv(args), *self.extra_args], api_key=self.api_key, log_path=self.log_path,
                             port=port, ready_file=self._ready_file, cwd=self.settings.data_dir, grace=self.grace)

    def _command(self, port: int) -> list[str]:
        return self._engine(port).command

    def _spawn(self) -> EngineProcess | None:
        self.api_key = self.settings.api_key  # a key changed in the settings takes effect at (re)start
        proc = self._engine(self._pick_port())
        with self._lock:
            if self._stop.is_set():
                return None
            self._proc = self._last = proc.spawn()
        return proc

    def _track_model(self, model: str | None) -> None:
        """A model switched through the API is the one a restarted engine loads (never the embedding
        model that indexed documents last: it cannot chat)."""
        if not model or _embeds_only(self.settings, model):
            return
        if self._path_model is None and self._orig_path is not None:
            self._path_model = model  # the id the engine gave the file it was started with
        if model == self._path_model:
            self.model_id, self.model_path = None, self._orig_path
        elif model != self.model_id:
            log.info("engine switched to model %s; a restart will load it", model)
            self.model_id, self.model_path = model, None

    def _model_args(self) -> dict:
        return {"model": str(self.model_path), "model_id": None} if self.model_path else {"model_id": self.model_id}

    def _pick_port(self) -> int:
        """The configured (or last used) port when it is free, else 0: the engine picks one and reports it."""
        port = self.port or (self.settings.server_port if self._port is None else self._port)
        if port and not _port_free(self.settings.server_host, port):
            log.warning("port %d is in use; the engine will pick a free port", port)
            return 0
        return port

    def _kill_child(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop(self.grace)

    # ---- state ----
    def _set(self, state: SupervisorState, message: str) -> None:
        with self._cond:
            changed = (state, message) != (self._state, self.message)  # "loading X" -> "serving X" counts too
            self._state, self.message = state, message
            self._cond.notify_all()
        if changed:
            log.info("engine %s%s", state, f": {message.splitlines()[0]}" if message.strip() else "")
            for callback in list(self._callbacks):
                try:
                    callback(state)
                except Exception:  # a subscriber's bug must not kill the watcher
                    log.exception("engine state callback failed")


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        if os.name == "posix":  # like the server: TIME_WAIT leftovers of a killed engine do not count
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _embeds_only(settings: Settings, model_id: str) -> bool:
    manifest = ModelStore(settings.models_dir).get(model_id)
    return manifest is not None and embeds_only(manifest.architecture)
