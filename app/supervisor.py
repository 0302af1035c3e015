"""EngineSupervisor: runs `python -m engine serve` as a child process and keeps it alive.

The child is started through app/engine_child.py, which adds one thing: it exits when this
process dies, so a killed app never leaves an engine holding its port and memory.

A watcher thread starts the child, learns its port from the ready file, follows `/health`
(loading -> ready), restarts the child when it dies (backoff 0.5 s doubling to 8 s; more than
`max_restarts` deaths within `restart_window` seconds is a crash loop and ends in state "error"),
and stops it on request (terminate, then kill after a grace period). Qt-free: state changes go to
callbacks, called from whichever thread changed the state (mostly the watcher).
The child's stdout and stderr go to `<data_dir>/logs/engine.log`; errors quote its tail.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from app.client import EngineClient, EngineClientError
from app.settings import Settings

log = logging.getLogger(__name__)

STATES = ("stopped", "starting", "ready", "crashed", "error")
PROJECT_ROOT = Path(__file__).resolve().parents[1]
MAX_LOG_BYTES = 5 << 20
LOOPBACK = ("127.0.0.1", "localhost", "::1")


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
        self._state, self.message = "stopped", ""
        self.port: int | None = None
        self.restarts = 0  # unexpected deaths followed by a restart, over this object's life
        self._callbacks: list[Callable[[str], None]] = []
        self._cond = threading.Condition()
        self._lock = threading.Lock()  # guards _proc and the stop flag against spawn/stop races
        self._proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._log_offset = 0
        ref = weakref.ref(self)
        atexit.register(lambda: (s := ref()) is not None and s._kill_child())

    # ---- public state ----
    @property
    def state(self) -> str:
        return self._state

    @property
    def base_url(self) -> str | None:
        if self.port is None or self._state in ("stopped",):
            return None
        host = self.settings.server_host
        host = "127.0.0.1" if host in ("0.0.0.0", "", "localhost") else ("::1" if host == "::" else host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def on_state_change(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """`callback(state)` when the state or its message changes (mostly from the watcher thread);
        read `.message` for the detail. Returns an unsubscribe function."""
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback) if callback in self._callbacks else None

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until "ready" (True) or "error"/"stopped"/timeout (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._state != "ready":
                if self._state in ("error", "stopped"):
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
        self._set("starting", "starting the engine")
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
        self._set("stopped", "")

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
                self._set("error", f"cannot start the engine: {e}")
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
            detail = f"{reason}{self._log_tail()}"
            if len(deaths) > self.max_restarts:
                self._set("error", f"the engine keeps failing ({len(deaths)} times in {self.restart_window:.0f} s); "
                                   f"last: {detail}")
                return
            delay = min(self.backoff[0] * 2 ** (len(deaths) - 1), self.backoff[1])
            log.warning("engine died (%s); restarting in %.1f s", reason, delay)
            self._set("crashed", f"{detail}\nrestarting in {delay:.1f} s")
            if self._stop.wait(delay):
                return
            self.restarts += 1
            self._set("starting", "restarting the engine")

    def _follow(self, proc: subprocess.Popen) -> str:
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
                    port = self._read_ready_file(proc.pid)
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
                    self._set("ready", f"serving {health.get('model') or 'no model'} at {self.base_url}")
                elif status == "loading":
                    self._set("starting", message or "loading the model")
                    if not ever_ready and time.monotonic() - t0 > self.load_timeout:
                        return f"the model did not load within {self.load_timeout:.0f} s"
                elif status == "error":
                    self._set("error", message or "the engine reported an error")
                elif not ever_ready and time.monotonic() - t0 > self.startup_timeout:
                    return f"the engine did not answer /health within {self.startup_timeout:.0f} s ({message})"
                self._stop.wait(1.0 if self._state in ("ready", "error") else 0.1)
            return "stopped"
        finally:
            if client is not None:
                client.close()

    def _command(self, port: int) -> list[str]:
        """`python -m engine serve` with the settings as flags, wrapped so that the engine ends
        when this process dies (app/engine_child.py)."""
        cmd = [sys.executable, "-m", "app.engine_child", "--parent-pid", str(os.getpid()), "serve",
               *self._model_args(), "--models-dir", str(self.settings.models_dir), "--host", self.settings.server_host,
               "--port", str(port), "--ready-file", str(self._ready_file),
               "--backend", self.settings.backend, "--device", self.settings.device, "--dtype", self.settings.dtype,
               "--kv-memory-fraction", str(self.settings.kv_memory_fraction)]
        if self.settings.server_host not in LOOPBACK:
            cmd.append("--allow-remote")  # set explicitly in the settings, and a key is always set
        if self.settings.threads:
            cmd += ["--threads", str(self.settings.threads)]
        return cmd + list(self.extra_args)

    def _spawn(self) -> subprocess.Popen | None:
        port = self._pick_port()
        self._ready_file.parent.mkdir(parents=True, exist_ok=True)
        self._ready_file.unlink(missing_ok=True)
        cmd = self._command(port)
        env = dict(os.environ)
        self.api_key = self.settings.api_key  # a key changed in the settings takes effect at (re)start
        env["EMBER_API_KEY"] = self.api_key  # not on the command line, where `ps` would show it
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # The engine shares the cores with the GUI: OpenMP threads that spin while they wait
        # starve it (a decode step measured 1.5 s spinning, 0.27 s passive on a busy 2-core box).
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        logf = self._open_log()
        try:
            with self._lock:
                if self._stop.is_set():
                    return None
                logf.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: "
                           f"{' '.join(cmd)}\n".encode())
                logf.flush()
                self._log_offset = logf.tell()
                self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                              env=env, cwd=str(self.settings.data_dir))
        finally:
            logf.close()
        log.info("engine started (pid %d, port %s), log: %s", self._proc.pid, port or "auto", self.log_path)
        return self._proc

    def _track_model(self, model: str | None) -> None:
        """A model switched through the API is the one a restarted engine loads."""
        if not model:
            return
        if self._path_model is None and self._orig_path is not None:
            self._path_model = model  # the id the engine gave the file it was started with
        if model == self._path_model:
            self.model_id, self.model_path = None, self._orig_path
        elif model != self.model_id:
            log.info("engine switched to model %s; a restart will load it", model)
            self.model_id, self.model_path = model, None

    def _model_args(self) -> list[str]:
        return ["--model", str(self.model_path)] if self.model_path else ["--model-id", str(self.model_id)]

    def _pick_port(self) -> int:
        """The configured (or last used) port when it is free, else 0: the engine picks one and reports it."""
        port = self.port or (self.settings.server_port if self._port is None else self._port)
        if port and not _port_free(self.settings.server_host, port):
            log.warning("port %d is in use; the engine will pick a free port", port)
            return 0
        return port

    def _read_ready_file(self, pid: int) -> int | None:
        try:
            info = json.loads(self._ready_file.read_text())
            port = int(info["port"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # not written yet, or half written
        if info.get("pid", pid) != pid or not 0 < port < 65536:
            return None
        return port

    def _kill_child(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            log.warning("engine (pid %d) did not stop within %.0f s; killing it", proc.pid, self.grace)
            proc.kill()
            proc.wait(timeout=10)
        self._ready_file.unlink(missing_ok=True)

    # ---- logs and state ----
    def _open_log(self):
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.log_path.exists() and self.log_path.stat().st_size > MAX_LOG_BYTES:
            os.replace(self.log_path, self.log_path.with_name(self.log_path.name + ".1"))
        return open(self.log_path, "ab")

    def _log_tail(self, max_lines: int = 15, max_chars: int = 2000) -> str:
        """The last lines this child wrote, to quote in an error message."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(self._log_offset, f.seek(0, os.SEEK_END) - 16384))
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        lines = [ln for ln in text.splitlines() if ln.strip()][-max_lines:]
        tail = "\n".join(lines)[-max_chars:]
        return f"\n--- engine log ({self.log_path}) ---\n{tail}" if tail else ""

    def _set(self, state: str, message: str) -> None:
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
