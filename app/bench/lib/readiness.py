"""Readiness probes: when a server is up, and when Ember's engine has gone quiet again.

A figure read too early measures the start or the last round's tail, not the state the bench
asks about, so every bench waits on these before it reads one.
"""
from __future__ import annotations

import time
from pathlib import Path


def wait_healthy(proc, base: str, name: str, log_path: Path, timeout: float = 300) -> None:
    """Poll `base`/health until it answers 200; fail if the process exits or `timeout` passes."""
    import httpx

    t0 = time.perf_counter()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} (see {log_path})")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"{name} did not become healthy in {timeout:.0f} s")
        time.sleep(0.5)


def engine_status(http, base: str, headers: dict) -> dict:
    """Ember's status route: requests, KV blocks and (with EMBER_DEBUG_HEAP) the heap."""
    return http.get(base + "/v1/engine/status", headers=headers, timeout=120).json()


def heap_trims(s: dict) -> int | None:
    """How many times the engine has trimmed its heap when idle (None where it does not trim)."""
    t = (s.get("heap") or {}).get("trims")
    return t["trims"] if t and t["idle_s"] > 0 else None


def settle(http, base: str, headers: dict, trims: int | None = None, timeout: float = 60.0) -> dict:
    """The status once the engine holds no request (aborts land on its next step) and, where it
    trims the heap when idle, has trimmed since `trims` was read: RSS is measured after that."""
    t0 = time.monotonic()
    while True:
        s = engine_status(http, base, headers)
        idle = not s["num_requests"] and not s["num_running"] and not s["num_waiting"]
        trimmed = trims is None or (heap_trims(s) or 0) > trims
        if (idle and not s["kv"]["blocks_used"] and trimmed) or time.monotonic() - t0 > timeout:
            return s
        time.sleep(0.1)
