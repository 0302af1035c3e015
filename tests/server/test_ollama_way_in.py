"""Ollama's way in: its documented `curl -d` requests (a JSON body sent as a form, or with no
type, or as text/plain) are read as JSON on every route, as Ollama and llama-server read them.

Oracles we did not write: the real `curl` binary (its `-d` sends
`application/x-www-form-urlencoded`), and the engine's own answer to the same request sent as
`application/json` by httpx (greedy: the same text).
"""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess

import httpx
import pytest
from server_util import start_engine, tiny_model

from engine.server.app import ServerSettings, create_app
from engine.server.json_body import is_json_type
from engine.service.engine_thread import EngineThread
from engine.service.loading import make_engine_factory

KEY = "test-key-123"
GREEDY = {"temperature": 0, "num_predict": 8}
CHAT = {"model": "model", "messages": [{"role": "user", "content": "Hello"}], "stream": False, "options": GREEDY}
GENERATE = {"model": "model", "prompt": "Once upon a time", "stream": False, "options": GREEDY}
OPENAI = {"model": "model", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0}


def _call(path: str, headers: dict, content: bytes, settings: ServerSettings | None = None) -> httpx.Response:
    """One request to the real app in this process (no model loaded), over ASGI."""
    app = create_app(EngineThread(make_engine_factory()), settings or ServerSettings(api_key=KEY))

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8765") as c:
            return await c.post(path, headers=headers, content=content)
    return asyncio.run(go())


def test_json_types():
    assert is_json_type("application/json") and is_json_type("application/json; charset=utf-8")
    assert is_json_type("application/vnd.api+json")
    assert not is_json_type("application/x-www-form-urlencoded") and not is_json_type("text/plain")
    assert not is_json_type("") and not is_json_type("multipart/form-data; boundary=x")


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "text/plain; charset=utf-8", "application/octet-stream"])
def test_a_json_body_is_read_whatever_its_type(content_type):
    """Past the body: the request reaches the engine, which has no model loaded (503), instead of
    being refused as "the request body must be a JSON object" (400)."""
    headers = {"Authorization": f"Bearer {KEY}", **({"Content-Type": content_type} if content_type else {})}
    body = json.dumps({"prompt": "x", "max_tokens": 2}).encode()
    r = _call("/v1/completions", headers, body)
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_loaded", r.text
    bad = _call("/v1/completions", headers, b"prompt=x")  # a real form is not JSON: said so
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json", bad.text


def test_the_security_checks_come_first():
    """A browser sends a text/plain POST without a preflight: the Origin check refuses it before its body is read."""
    body = json.dumps({"prompt": "x"}).encode()
    r = _call("/v1/completions", {"Authorization": f"Bearer {KEY}", "Content-Type": "text/plain",
                                  "Origin": "https://evil.example"}, body)
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_origin"
    r = _call("/v1/completions", {"Content-Type": "text/plain"}, body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


@pytest.fixture(scope="module")
def server(tiny_model_factory, tmp_path_factory):
    proc = start_engine(tiny_model(tiny_model_factory), tmp_path_factory.mktemp("srv"))
    yield proc
    proc.stop()


def _curl(url: str, body: dict, *headers: str) -> dict:
    """`curl URL -d BODY [-H ...]`: the real binary, as Ollama's documentation writes it."""
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("no curl binary")
    argv = [curl, "-sS", url, "-d", json.dumps(body)]
    for h in headers:
        argv += ["-H", h]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(run.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("path,body", [("/api/generate", GENERATE), ("/api/chat", CHAT),
                                       ("/v1/chat/completions", OPENAI)])
def test_curl_d_is_answered_as_json_is(server, path, body):
    want = httpx.post(server.base_url + path, headers=server.headers, json=body, timeout=120)
    assert want.status_code == 200, want.text
    got = _curl(server.base_url + path, body, f"Authorization: Bearer {server.api_key}")
    assert "error" not in got, got
    text = lambda r: r.get("response") or (r.get("message") or {}).get("content") or r["choices"][0]["message"]["content"]
    assert text(got) == text(want.json()) and text(got)


@pytest.mark.slow
@pytest.mark.parametrize("content_type", [None, "text/plain"])
def test_httpx_without_a_json_type(server, content_type):
    headers = {**server.headers, **({"Content-Type": content_type} if content_type else {})}
    r = httpx.post(server.base_url + "/api/chat", headers=headers, content=json.dumps(CHAT).encode(), timeout=120)
    assert r.status_code == 200 and r.json()["message"]["content"], r.text
