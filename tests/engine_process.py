"""A real engine process (`python -m engine serve --port 0`) for tests of app.client and friends."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class EngineProcess:
    """Starts the engine on a model file, waits for its ready file and /health == ready."""

    def __init__(self, model: Path, workdir: Path, api_key: str = "test-key-0123456789",
                 extra: tuple[str, ...] = ()) -> None:
        self.api_key = api_key
        self.model = model
        self.models_dir = workdir / "models"
        self.models_dir.mkdir(parents=True, exist_ok=True)
        self.ready_file = workdir / "ready.json"
        self.log_path = workdir / "engine.log"
        cmd = [sys.executable, "-m", "engine", "serve", "--model", str(model), "--port", "0",
               "--ready-file", str(self.ready_file), "--models-dir", str(self.models_dir),
               "--backend", "torch", "--device", "cpu", *extra]
        env = {**os.environ, "EMBER_API_KEY": api_key,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.port: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 120.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.port is None and self.ready_file.exists():
                try:
                    self.port = int(json.loads(self.ready_file.read_text())["port"])
                except (ValueError, KeyError):
                    pass
            if self.port is not None:
                try:
                    if httpx.get(self.base_url + "/health", timeout=2).json().get("status") == "ready":
                        return
                except (httpx.HTTPError, ValueError):
                    pass
            time.sleep(0.1)
        raise TimeoutError(f"engine not ready after {timeout}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_bytes()[-n:].decode("utf-8", errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def write_manifest(models_dir: Path, model_id: str, path: Path) -> None:
    """Register a model file in the store layout the engine reads (what app/store.py writes)."""
    d = models_dir / model_id
    d.mkdir(parents=True, exist_ok=True)
    (d / "manifest.json").write_text(json.dumps({
        "id": model_id, "name": model_id, "path": str(path), "format": "gguf", "architecture": "llama",
        "sha256": "", "size_bytes": path.stat().st_size, "context_length": 512, "quantization": "F32",
        "parameter_count": 0, "source": "import", "added_at": time.time()}))
