"""Several models at once, over real HTTP with the official clients (issue 63): a long streamed
reply of one model runs on, token for token as alone, while another model loads and answers and
a broken one is refused in words; /api/ps lists both; keep_alive 0 unloads; Ollama's `name:latest`
works on OpenAI's and Anthropic's routes; and with memory for one model, the next waits for the
running reply, then the first is unloaded for it."""
from __future__ import annotations

import json
import secrets
import threading
import time

import anthropic
import ollama
import openai
import pytest

from app.engine_process import EngineProcess
from engine.service.loading import estimate_bytes
from engine.service.residency import ResidencyConfig
from engine.service.served_model import ModelSpec
from server_util import LONG_CTX, TINY_CTX, long_max_tokens

PROMPT = "Once upon a time"
MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def store(tiny_model_factory, tmp_path_factory):
    """model-a (a long context: replies that outlast a moment), model-b, model-a2 (model-a's file
    under another id: a second model of the same size) and broken (a truncated file)."""
    root = tmp_path_factory.mktemp("models")
    a, b = tiny_model_factory(ctx=LONG_CTX), tiny_model_factory(ctx=TINY_CTX)
    broken = root / "broken.gguf"
    broken.write_bytes(b.read_bytes()[: b.stat().st_size // 2])
    for mid, path in (("model-a", a), ("model-a2", a), ("model-b", b), ("broken", broken)):
        (root / mid).mkdir()
        (root / mid / "manifest.json").write_text(json.dumps({"id": mid, "name": mid, "path": str(path),
                                                              "format": "gguf"}))
    return root


def start(store, tmp_path, *extra: str) -> EngineProcess:
    return EngineProcess(["--models-dir", str(store), "--model-id", "model-a", "--backend", "torch",
                          "--threads", "1", "--num-kv-blocks", "512", *extra], api_key=secrets.token_urlsafe(16),
                         log_path=tmp_path / "engine.log").start(timeout=240)


@pytest.fixture(scope="module")
def server(store, tmp_path_factory):
    proc = start(store, tmp_path_factory.mktemp("several"))
    yield proc
    proc.stop()


class Stream(threading.Thread):
    """A streamed greedy completion of model-a read on its own thread; `started` once the first
    text arrives, `ended_at` when the last did."""

    def __init__(self, proc: EngineProcess, max_tokens: int, model: str = "model-a") -> None:
        super().__init__(daemon=True)
        self.client = openai.OpenAI(base_url=proc.base_url + "/v1", api_key=proc.api_key, max_retries=0, timeout=300)
        self.model, self.max_tokens = model, max_tokens
        self.started, self.text, self.finish, self.error, self.ended_at = threading.Event(), "", None, None, None

    def run(self) -> None:
        try:
            for chunk in self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=self.max_tokens,
                                                        temperature=0, stream=True, extra_body={"ignore_eos": True}):
                self.text += chunk.choices[0].text
                self.finish = chunk.choices[0].finish_reason or self.finish
                self.started.set()
            self.ended_at = time.monotonic()
        except Exception as e:  # reported by the test
            self.error = e
            self.started.set()


def status(proc: EngineProcess) -> dict:
    import httpx
    return httpx.get(proc.base_url + "/v1/engine/status", headers=proc.headers, timeout=30).json()


def wait_until(cond, what: str, timeout: float = 120.0):
    end = time.monotonic() + timeout
    while not (got := cond()):
        assert time.monotonic() < end, f"never saw {what}"
        time.sleep(0.05)
    return got


def test_a_reply_runs_on_while_other_models_load_answer_and_fail(server):
    o = ollama.Client(host=server.base_url, headers=server.headers, timeout=120)
    n = long_max_tokens(server.base_url, server.api_key, seconds=8)
    alone = Stream(server, n)
    alone.run()
    assert alone.error is None and alone.finish == "length"

    a = Stream(server, n)
    a.start()
    assert a.started.wait(120) and a.error is None
    b = o.chat("model-b:latest", messages=MSGS, options={"num_predict": 4, "temperature": 0}, stream=False)
    assert b.done and b.model == "model-b:latest"
    with pytest.raises(openai.BadRequestError) as e:  # refused in words; nothing else is touched
        a.client.chat.completions.create(model="broken", messages=MSGS, max_tokens=2)
    assert e.value.body["code"] == "model_load_failed" and "loading broken failed" in e.value.body["message"]
    names = {m.model for m in o.ps().models}
    assert names == {"model-a:latest", "model-b:latest"}
    running = {m["id"]: m["running"] for m in status(server)["models"]}
    assert running["model-a"] == 1 and not a.ended_at  # a's reply was in flight throughout
    a.join(300)
    assert a.error is None and a.text == alone.text and a.finish == "length"

    # Ollama's `name:latest` on OpenAI's and Anthropic's routes
    r = a.client.chat.completions.create(model="model-b:latest", messages=MSGS, max_tokens=2)
    assert r.model == "model-b"
    m = anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, max_retries=0).messages.create(
        model="model-a:latest", max_tokens=2, messages=MSGS)
    assert m.model == "model-a"
    # keep_alive 0 on an empty request: Ollama's way to unload (`ollama stop`)
    assert o.generate("model-b", prompt="", keep_alive=0).done_reason == "unload"
    assert {m.model for m in o.ps().models} == {"model-a:latest"}
    s = status(server)
    assert s["memory"]["used_bytes"] == sum(m["bytes"] for m in s["models"]) > 0 and s["queue"] == []
    assert s["models"][0]["speculative"] is False and s["models"][0]["thinking"] == s["thinking"]  # each model's own


def test_with_memory_for_one_model_the_next_waits_for_the_running_reply(server, store, tmp_path):
    """The budget fits one model: a request for model-a2 waits (its place shown) until model-a's
    reply ends, then model-a is unloaded for it; the running reply is never cut."""
    a_bytes = next(m["bytes"] for m in status(server)["models"] if m["id"] == "model-a")
    path = json.loads((store / "model-a2" / "manifest.json").read_text())["path"]
    a2_need = estimate_bytes(ModelSpec("model-a2", path), ResidencyConfig(), num_kv_blocks=512)
    budget = max(a_bytes, a2_need) * 1.3  # one fits, two do not
    assert a_bytes + a2_need > budget
    proc = start(store, tmp_path, "--memory-budget", f"{budget / 2**30:.9f}")
    try:
        n = long_max_tokens(proc.base_url, proc.api_key, seconds=8)
        a = Stream(proc, n)
        a.start()
        assert a.started.wait(120) and a.error is None
        b = Stream(proc, 4, model="model-a2")
        b.start()
        queue = wait_until(lambda: status(proc)["queue"], "model-a2 waiting for memory")
        assert queue[0]["model"] == "model-a2" and queue[0]["position"] == 1
        s = status(proc)
        assert [m["id"] for m in s["models"]] == ["model-a"] and s["models"][0]["running"] == 1
        a.join(300)
        b.join(300)
        assert a.error is None and a.finish == "length" and b.error is None and b.finish == "length"
        assert b.ended_at > a.ended_at  # it ran only after the reply that held the memory
        assert [m["id"] for m in status(proc)["models"]] == ["model-a2"]  # model-a unloaded only then
    finally:
        proc.stop()
