"""Helpers for the server tests: a real `python -m engine serve` child on a tiny or the bundled model."""
from __future__ import annotations

import secrets
from pathlib import Path

from engine.server.launch import EngineProcess

TINY_CTX = 512


def start_engine(model: Path, tmp_dir: Path, *extra: str, api_key: str | None = "auto",
                 backend: str = "torch") -> EngineProcess:
    key = secrets.token_urlsafe(16) if api_key == "auto" else api_key
    if "--num-kv-blocks" not in extra:  # the default pool is a share of free RAM: gigabytes
        extra = ("--num-kv-blocks", "512", *extra)
    proc = EngineProcess(["--model", str(model), "--backend", backend, "--threads", "1", *extra],
                         api_key=key, log_path=tmp_dir / "engine.log")
    try:
        return proc.start(timeout=240)
    except Exception:
        log = (tmp_dir / "engine.log").read_text(errors="replace")[-4000:]
        raise RuntimeError(f"engine failed to start; log tail:\n{log}") from None


def tiny_model(factory) -> Path:
    """A tiny random llama with a real BPE tokenizer and ChatML template (tests/gguf_factory.py)."""
    return factory(ctx=TINY_CTX)
