"""Start `python -m engine serve` as a child process and learn its port from the ready file.

For a parent that needs a server of its own for a while (the server bench, the tests); the
desktop app's long-lived, restarting engine is app/supervisor.py. The API key travels in the
child's environment (EMBER_API_KEY), not on its command line where `ps` would show it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


class EngineProcess:
    def __init__(self, args: list[str], api_key: str | None = None, env: dict | None = None,
                 log_path: str | os.PathLike | None = None) -> None:
        self.args, self.api_key = list(args), api_key
        self.env = {**os.environ, **(env or {})}
        if api_key:
            self.env["EMBER_API_KEY"] = api_key
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="ember-engine-")
        self.ready_file = Path(self._tmp.name) / "ready.json"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def start(self, timeout: float = 180.0, wait_ready: bool = True) -> "EngineProcess":
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        cmd = [sys.executable, "-m", "engine", "serve", "--port", "0", "--ready-file",
               str(self.ready_file), *self.args]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the engine did not start listening within {timeout:.0f}s")
            time.sleep(0.05)
        self.port = json.loads(self.ready_file.read_text())["port"]
        if wait_ready:
            self.wait_ready(deadline - time.monotonic())
        return self

    def health(self) -> dict:
        return httpx.get(self.base_url + "/health", timeout=10).json()

    def wait_ready(self, timeout: float = 180.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            h = self.health()
            if h["status"] == "ready":
                return h
            if h["status"] == "error":
                raise RuntimeError(f"the engine failed to load its model: {h['message']}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the model did not load within {timeout:.0f}s: {h}")
            time.sleep(0.1)

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the engine exited with code {self.proc.returncode}"
                               + (f"; see {self.log_path}" if self.log_path else ""))

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._tmp.cleanup()
        return self.proc.returncode

    def __enter__(self) -> "EngineProcess":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
