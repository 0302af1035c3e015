"""Server processes a bench starts beside Ember's: llama.cpp's own server, and stopping one.

(Ember's engine process has its own wrapper, app/engine_process.py.)
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path

from app.bench.lib.readiness import wait_healthy


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_server(binary: str, model: str, slots: int, ctx: int, threads: int | None, log_path: Path,
                 extra: tuple[str, ...] = ()):
    """llama.cpp's server on a free port with `slots` slots and `ctx` cells in all, healthy;
    yields (process, base URL) and stops it afterwards (the peer of `ember bench server`,
    `footprint` and `spec`)."""
    import os
    import subprocess

    port = free_port()
    cmd = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
           "-c", str(ctx), "-t", str(threads or os.cpu_count() or 1), "--no-webui", *extra]
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(proc, base, "llama-server", log_path)
        yield proc, base
    finally:
        stop_process(proc)


def stop_process(proc, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `grace` seconds."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
