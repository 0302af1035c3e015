"""EngineProcess: one engine child process, from spawn to stop; and the engine's arguments from the settings.

Every parent that runs an engine goes through here: the supervisor (which adds its restart policy
and states), `ember bench server` and the tests. The child is `python -m engine serve` run through
app/engine_child.py, so that it ends when this process dies (app.frozen says how in a bundle). It
listens on `--port` (0: a free one) and writes its port to `--ready-file`, which is how the parent
learns it. The API key travels in the child's environment (EMBER_API_KEY), never on its command
line where `ps` would show it. Its stdout and stderr go to a log file; errors quote the tail this
child wrote.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from app import frozen
from app.client import EngineClient, EngineClientError
from app.settings import Settings
from app.speculative_setting import engine_speculative

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
MAX_LOG_BYTES = 5 << 20  # a longer log is moved aside (<name>.1) when the next child starts


def engine_args(settings: Settings) -> dict[str, Any]:
    """The `serve` arguments (by argparse dest) that the user's settings decide: the one mapping
    used by the supervisor's engine and `ember serve`. The key is among them; `to_argv` refuses it."""
    return {"model_id": settings.default_model, "models_dir": str(settings.models_dir),
            "host": settings.server_host, "port": settings.server_port, "ollama_port": settings.ollama_port,
            "ollama_keyless": settings.ollama_keyless, "api_key": settings.api_key,
            "backend": settings.backend, "device": settings.device, "dtype": settings.dtype,
            "kv_memory_fraction": settings.kv_memory_fraction, "threads": settings.threads,
            "memory_budget": settings.memory_budget_gb, "max_loaded_models": settings.max_loaded_models,
            "keep_alive": settings.keep_alive, "docs_dir": str(settings.docs_dir),
            "embedding_model": settings.embedding_model, "fetch_image_urls": settings.fetch_image_urls,
            "kv_disk_dir": str(settings.kv_cache_dir) if settings.kv_disk_gib > 0 else None,
            "kv_disk_budget_gib": settings.kv_disk_gib,
            "speculative": engine_speculative(settings.speculative, settings.models_dir)}


def to_argv(args: Mapping[str, Any]) -> list[str]:
    """{"max_num_seqs": 16, "allow_remote": True, "threads": None} -> ["--max-num-seqs", "16", "--allow-remote"]."""
    if "api_key" in args:
        raise ValueError("the API key goes in the child's environment, never on its command line")
    argv: list[str] = []
    for dest, value in args.items():
        flag = "--" + dest.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not None and value is not False:  # "-1m" would read as an option: "--keep-alive=-1m"
            argv += [f"{flag}={value}"] if str(value).startswith("-") else [flag, str(value)]
    return argv


def connect_url(host: str, port: int) -> str:
    """The URL a client on this machine uses for a server bound to `host` (a wildcard is reached on loopback)."""
    host = "127.0.0.1" if host in ("0.0.0.0", "", "localhost") else ("::1" if host == "::" else host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class EngineProcess:
    """One engine child. `spawn()`, `poll()` and `read_port()` never block (for a parent with a loop
    of its own: the supervisor); `start()` spawns and waits until /health says ready."""

    def __init__(self, args: Sequence[str], *, api_key: str | None, log_path: str | os.PathLike, port: int = 0,
                 ready_file: str | os.PathLike | None = None, cwd: str | os.PathLike | None = None,
                 grace: float = 10.0, new_session: bool = False) -> None:
        self.args, self.api_key, self.log_path = list(args), api_key, Path(log_path)
        self.new_session = new_session  # its own session: a terminal's Ctrl-C reaches the parent alone
        self.requested_port, self.cwd, self.grace = port, cwd, grace
        self._tmp = None if ready_file else tempfile.TemporaryDirectory(prefix="ember-engine-")
        self.ready_file = Path(ready_file) if ready_file else Path(self._tmp.name) / "ready.json"
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None  # from the ready file, once the child listens
        self.host = "127.0.0.1"
        self._log_offset = 0  # where this child's output starts in the log
        self._client: EngineClient | None = None

    @property
    def command(self) -> list[str]:
        return [*frozen.engine_child_command(), "--parent-pid", str(os.getpid()), "serve", *self.args,
                "--port", str(self.requested_port), "--ready-file", str(self.ready_file)]

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def base_url(self) -> str | None:
        return None if self.port is None else connect_url(self.host, self.port)

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    # ---- the child's life ----
    def spawn(self) -> EngineProcess:
        if self.proc is not None:
            raise RuntimeError("this engine process was spawned already")
        self.ready_file.parent.mkdir(parents=True, exist_ok=True)
        self.ready_file.unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "EMBER_API_KEY"}
        if self.api_key:
            env["EMBER_API_KEY"] = self.api_key
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # OpenMP keeps its own wait policy (spin briefly, then sleep). OMP_WAIT_POLICY=PASSIVE, which
        # this set once, puts every parallel region of a decode step behind a futex wake-up: the desktop
        # app's engine decoded the bundled model at 50 tok/s instead of 120 (ember serve: 55 vs 170-190),
        # with the same idle CPU. The tests, whose engines share 2 cores with pytest, set it themselves.
        cmd = self.command
        with self._open_log() as logf:
            logf.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
            logf.flush()
            self._log_offset = logf.tell()
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                         env=env, cwd=None if self.cwd is None else str(self.cwd),
                                         start_new_session=self.new_session)
        log.info("engine started (pid %d, port %s), log: %s", self.proc.pid, self.requested_port or "auto",
                 self.log_path)
        return self

    def poll(self) -> int | None:
        """The exit code once the child has ended, else None."""
        return None if self.proc is None else self.proc.poll()

    def read_port(self) -> int | None:
        """The port from the ready file once this child wrote it (None before, or while it is half written)."""
        if self.port is None and self.proc is not None:
            try:
                info = json.loads(self.ready_file.read_text())
                port = int(info["port"])
            except (OSError, ValueError, KeyError, TypeError):
                return None
            if info.get("pid", self.proc.pid) != self.proc.pid or not 0 < port < 65536:
                return None  # a file left by another child
            self.port, self.host = port, str(info.get("host") or self.host)
        return self.port

    def health(self) -> dict:
        """The child's /health; raises EngineClientError while it does not answer."""
        if self._client is None:
            if self.read_port() is None:
                raise EngineClientError("the engine is not listening yet")
            self._client = EngineClient(self.base_url, api_key=self.api_key, timeout=10.0)
        return self._client.health()

    def wait_ready(self, timeout: float = 240.0) -> dict:
        """Block until /health says ready (returns it); raises with the log's tail when the child
        exits, reports an error or is not ready in time."""
        deadline = time.monotonic() + timeout
        health: dict = {"status": "not listening"}
        while True:
            rc = self.poll()
            if rc is not None:
                raise RuntimeError(f"the engine exited with code {rc}{self.log_tail(40, 4000)}")
            if self.read_port() is not None:
                try:
                    health = self.health()
                except EngineClientError as e:
                    health = {"status": "unreachable", "message": str(e)}
                if health.get("status") == "ready":
                    return health
                if health.get("status") == "error":
                    raise RuntimeError(f"the engine failed to load its model: {health.get('message')}"
                                       f"{self.log_tail(40, 4000)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the engine was not ready within {timeout:.0f} s ({health})"
                                   f"{self.log_tail(40, 4000)}")
            time.sleep(0.05)

    def start(self, timeout: float = 240.0) -> EngineProcess:
        """Spawn and wait until ready; on failure the child is stopped before the error is raised."""
        self.spawn()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, grace: float | None = None) -> int | None:
        """Terminate, then kill after `grace` seconds; the exit code (None if never spawned)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            grace = self.grace if grace is None else grace
            proc.terminate()
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log.warning("engine (pid %d) did not stop within %.0f s; killing it", proc.pid, grace)
                proc.kill()
                proc.wait(timeout=10)
        self.ready_file.unlink(missing_ok=True)
        if self._tmp is not None:
            self._tmp.cleanup()
        return proc.returncode

    def __enter__(self) -> EngineProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- its log ----
    def _open_log(self):
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.log_path.exists() and self.log_path.stat().st_size > MAX_LOG_BYTES:
            os.replace(self.log_path, self.log_path.with_name(self.log_path.name + ".1"))
        return open(self.log_path, "ab")

    def log_tail(self, max_lines: int = 15, max_chars: int = 2000) -> str:
        """The last lines this child wrote, to quote in an error message ("" when there are none)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(self._log_offset, f.seek(0, os.SEEK_END) - 16384))
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        lines = [ln for ln in text.splitlines() if ln.strip()][-max_lines:]
        tail = "\n".join(lines)[-max_chars:]
        return f"\n--- engine log ({self.log_path}) ---\n{tail}" if tail else ""
