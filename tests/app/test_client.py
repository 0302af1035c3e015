"""EngineClient against a real engine process on a tiny generated model (real HTTP on 127.0.0.1).

The official `openai` client is the oracle for what the stream says; the engine's own status
shows that closing a stream aborts its sequence.
"""
from __future__ import annotations

import threading
import time

import pytest

from app.client import ChatDelta, EngineClient, EngineClientError, sse_events
from engine_process import write_manifest
from server_util import LONG_CTX, long_max_tokens, start_engine

PROMPT = [{"role": "user", "content": "Hello, how are you today?"}]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    """The engine's model store: empty until a test installs a model into it."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def engine(tiny_model_factory, tmp_path_factory, models_dir):
    # a small fixed KV pool: sizing it from free RAM would allocate a GiB for a tiny model; a long
    # context (256 blocks hold it), so that a reply can outlast any moment a test acts in
    proc = start_engine(tiny_model_factory(ctx=LONG_CTX), tmp_path_factory.mktemp("engine"),
                        "--models-dir", str(models_dir), "--device", "cpu", "--num-kv-blocks", "256")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def client(engine):
    with EngineClient(engine.base_url, api_key=engine.api_key) as c:
        yield c


def wait_idle(client: EngineClient, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status = client.status()
        if status["num_running"] == 0 and status["num_waiting"] == 0:
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"engine still busy: {status}")
        time.sleep(0.05)


@pytest.mark.slow  # a real engine process: its start alone takes seconds
def test_health_status_and_models(client, engine):
    health = client.health()
    assert health["status"] == "ready" and health["backend"] == "torch"
    status = client.status()
    assert status["status"] == "ready" and status["kv"]["blocks_total"] > 0
    ids = [m["id"] for m in client.models()]
    assert status["model"] in ids
    # base URLs with /v1 (as users paste them for vLLM or Ollama) work the same
    with EngineClient(engine.base_url + "/v1/", api_key=engine.api_key) as c2:
        assert [m["id"] for m in c2.models()] == ids


@pytest.mark.slow
def test_stream_matches_the_official_openai_client(client, engine):
    openai = pytest.importorskip("openai")
    params = dict(temperature=0, max_tokens=24, seed=1)
    stream = client.chat_stream(PROMPT, **params)
    deltas = list(stream)
    assert deltas and all(isinstance(d, ChatDelta) for d in deltas)
    text = "".join(d.text for d in deltas)
    assert text == stream.text and text
    final = deltas[-1]
    assert final.usage is not None and final.usage.completion_tokens == 24
    assert final.usage.prompt_tokens > 5 and final.usage.total_tokens == final.usage.prompt_tokens + 24
    assert stream.finish_reason == "length"
    assert final.ttft is not None and 0 < final.ttft < 30
    assert final.tok_s is not None and final.tok_s > 0
    # the same request through the official client gives the same text, token for token (greedy)
    oa = openai.OpenAI(base_url=engine.base_url + "/v1", api_key=engine.api_key)
    chunks = oa.chat.completions.create(model=stream.model, messages=PROMPT, stream=True, **params)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    # and the non-streaming call agrees too
    whole = client.chat(PROMPT, **params)
    assert whole.text == text and whole.finish_reason == "length" and whole.usage.completion_tokens == 24


@pytest.mark.slow
def test_close_aborts_the_sequence_on_the_server(client, engine):
    n = long_max_tokens(engine.base_url, engine.api_key)
    before = wait_idle(client)
    stream = client.chat_stream(PROMPT, temperature=0.8, max_tokens=n, ignore_eos=True)
    got = [next(stream) for _ in range(3)]
    assert all(d.text for d in got)
    assert client.status()["num_running"] == 1
    stream.close()
    assert list(stream) == []  # closed: iteration ends
    after = wait_idle(client, timeout=5)
    assert after["kv"]["blocks_used"] <= before["kv"]["blocks_used"] + 1  # its blocks went back


@pytest.mark.slow
def test_cancel_from_another_thread_ends_a_blocked_read(client, engine):
    n = long_max_tokens(engine.base_url, engine.api_key)
    stream = client.chat_stream(PROMPT, temperature=0.8, max_tokens=n, ignore_eos=True)
    next(stream)
    seen: list[ChatDelta] = []
    done = threading.Event()

    def consume() -> None:
        for d in stream:
            seen.append(d)
        done.set()

    t = threading.Thread(target=consume)
    t.start()
    deadline = time.monotonic() + 30
    while len(seen) < 3:  # the consumer is reading: cancel while it waits for the next token
        assert t.is_alive() and time.monotonic() < deadline, seen
        time.sleep(0.01)
    stream.cancel()
    assert done.wait(5), "the consumer did not stop after cancel()"
    t.join(5)
    assert len(seen) < n - 1
    wait_idle(client, timeout=5)


@pytest.mark.slow
def test_errors_carry_the_server_message(client, engine):
    with EngineClient(engine.base_url, api_key="wrong-key-xxxxxxxx") as bad:
        with pytest.raises(EngineClientError) as e:
            bad.models()
        assert e.value.status_code == 401 and e.value.message
        with pytest.raises(EngineClientError) as e:
            bad.chat_stream(PROMPT)
        assert e.value.status_code == 401
    with pytest.raises(EngineClientError) as e:
        client.chat_stream(PROMPT, temperature=-3)
    assert e.value.status_code == 400 and "temperature" in e.value.message
    with pytest.raises(EngineClientError) as e:
        client.load_model("no-such-model")
    assert e.value.status_code == 404 and "no-such-model" in e.value.message and e.value.code == "model_not_found"


def test_unreachable_server_is_a_clear_error():
    import socket

    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with EngineClient(f"http://127.0.0.1:{port}") as c:
        with pytest.raises(EngineClientError, match="cannot reach"):
            c.health()
        with pytest.raises(EngineClientError, match="cannot reach"):
            c.chat_stream(PROMPT)
    with pytest.raises(ValueError):
        EngineClient("localhost:8765")


@pytest.mark.slow
def test_load_and_unload_by_id(client, engine, models_dir, tiny_model_factory):
    other = tiny_model_factory(seed=7, hidden=32, n_heads=2, n_kv_heads=1, ctx=LONG_CTX)
    write_manifest(models_dir, "tiny-other", other)
    original = client.status()["model"]
    try:
        assert client.load_model("tiny-other")["status"] == "ready"
        assert client.status()["model"] == "tiny-other"
        reply = client.chat(PROMPT, max_tokens=4, temperature=0)
        assert reply.usage.completion_tokens == 4
        # unloading under a running stream cuts nothing: the reply runs to its end, then the model goes
        n = long_max_tokens(engine.base_url, engine.api_key, seconds=4)  # still running when the unload comes
        stream = client.chat_stream(PROMPT, "tiny-other", max_tokens=n, ignore_eos=True, temperature=0.8)
        next(stream)
        after = client.unload_model("tiny-other")
        assert after["status"] == "ready"  # it serves on until the reply ends
        deltas = list(stream)
        assert "length" in {d.finish_reason for d in deltas} and deltas[-1].usage.completion_tokens == n
        assert wait_for(lambda: "tiny-other" not in {m["id"] for m in client.status()["models"]})
        assert client.unload_model()["status"] == "unloaded"  # none named: every model
    finally:
        write_manifest(models_dir, "tiny-main", tiny_model_factory(ctx=LONG_CTX))  # the engine's model
        client.load_model("tiny-main")
    assert client.health()["status"] == "ready" and original


def wait_for(cond, timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def test_sse_parsing_follows_the_spec():
    lines = [": keep-alive comment", "event: message", "data: {\"a\":", "data: 1}", "", "",
             "data:[DONE]", "", "data: tail-without-blank"]
    assert list(sse_events(iter(lines))) == ['{"a":\n1}', "[DONE]", "tail-without-blank"]


# ---- a third-party OpenAI-compatible server: llama-cpp-python's own, on the same tiny model ----

@pytest.fixture(scope="module")
def llama_cpp_server(tiny_model_factory, tmp_path_factory):
    pytest.importorskip("sse_starlette")
    pytest.importorskip("starlette_context")
    import socket
    import subprocess
    import sys

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path_factory.mktemp("llama-cpp-server") / "log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(tiny_model_factory()),
                             "--host", "127.0.0.1", "--port", str(port), "--api_key", "remote-key", "--n_ctx", "512"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"  # as a user pastes it
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, "llama_cpp.server exited"
            try:
                if httpx.get(url + "/models", headers={"Authorization": "Bearer remote-key"}).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "llama_cpp.server did not start"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.mark.slow
def test_remote_openai_compatible_server(llama_cpp_server):
    with EngineClient(llama_cpp_server, api_key="remote-key") as c:
        assert c.health()["status"] == "ready"  # no /health there: the model list answers instead
        models = c.models()
        status = c.status()  # no /v1/engine/status either: a summary
        assert status["remote"] is True and status["model"] == models[0]["id"]
        stream = c.chat_stream(PROMPT, max_tokens=8, temperature=0)  # no model given: the first listed
        deltas = list(stream)
        assert stream.text and stream.finish_reason == "length" and stream.model == models[0]["id"]
        assert deltas[-1].ttft is not None and (stream.usage is not None or stream.tok_s is not None)
        whole = c.chat(PROMPT, max_tokens=8, temperature=0)
        assert whole.text == stream.text and whole.usage.completion_tokens == 8
    with EngineClient(llama_cpp_server, api_key="wrong") as bad:
        with pytest.raises(EngineClientError) as e:
            bad.models()
        assert e.value.status_code == 401
