"""Ollama's way in: its documented `curl -d` requests (a JSON body sent as a form, or with no
type, or as text/plain) are read as JSON on every route, as Ollama and llama-server read them;
and with `--ollama-keyless` ("Ollama's port too", without the key) a program on this computer
needs no key on the Ollama port, while Ember's own port still asks for it and Host and Origin
are checked on both.

Oracles we did not write: the real `curl` binary (its `-d` sends
`application/x-www-form-urlencoded`), the official `ollama` client, and the engine's own answer
to the same request sent as `application/json` with the key by httpx (greedy: the same text).
"""
from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess

import httpx
import pytest
from server_util import start_engine, tiny_model

from engine.server.app import ServerSettings, create_app
from engine.server.auth import SecurityPolicy
from engine.server.json_body import is_json_type
from engine.service.engine_thread import EngineThread
from engine.service.loading import make_engine_factory

KEY = "test-key-123"
GREEDY = {"temperature": 0, "num_predict": 8}
CHAT = {"model": "model", "messages": [{"role": "user", "content": "Hello"}], "stream": False, "options": GREEDY}
GENERATE = {"model": "model", "prompt": "Once upon a time", "stream": False, "options": GREEDY}
OPENAI = {"model": "model", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0}


def _call(path: str, headers: dict, content: bytes, settings: ServerSettings | None = None,
          port: int = 8765, client: tuple[str, int] = ("127.0.0.1", 50000)) -> httpx.Response:
    """One request to the real app in this process (no model loaded), over ASGI: the scope's
    "server" is ("127.0.0.1", port), its "client" the peer's address."""
    app = create_app(EngineThread(make_engine_factory()), settings or ServerSettings(api_key=KEY))
    transport = httpx.ASGITransport(app=app, client=client)

    async def go():
        async with httpx.AsyncClient(transport=transport, base_url=f"http://127.0.0.1:{port}") as c:
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


def test_a_keyless_port_serves_this_computer_only():
    """The scope's own addresses decide: the listening port, and a loopback peer."""
    settings = ServerSettings(api_key=KEY, keyless_ports=(11434,))
    body = json.dumps({"prompt": "x"}).encode()
    r = _call("/v1/completions", {}, body, settings, port=11434)
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_loaded", r.text
    for port, client in ((8765, ("127.0.0.1", 50000)), (11434, ("192.168.1.9", 50000))):
        r = _call("/v1/completions", {}, body, settings, port=port, client=client)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (port, client)
    r = _call("/v1/completions", {"Origin": "https://evil.example"}, body, settings, port=11434)
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_origin"
    p = SecurityPolicy.build("k", keyless_ports=[11434])
    assert p.keyless(("127.0.0.1", 11434), ("::1", 1)) and p.keyless(("0.0.0.0", 11434), ("127.0.0.5", 1))
    assert not p.keyless(("127.0.0.1", 8765), ("127.0.0.1", 1)) and not p.keyless(("127.0.0.1", 11434), None)
    assert not p.keyless(None, ("127.0.0.1", 1)) and not SecurityPolicy.build("k").keyless(("h", 11434), ("::1", 1))


@pytest.fixture(scope="module")
def server(tiny_model_factory, tmp_path_factory):
    """Ember's port with its key, and the Ollama port without it for this computer."""
    with socket.socket() as s:  # a free port for the second listener (Ollama's 11434 may be taken here)
        s.bind(("127.0.0.1", 0))
        ollama_port = s.getsockname()[1]
    proc = start_engine(tiny_model(tiny_model_factory), tmp_path_factory.mktemp("srv"),
                        "--ollama-port", str(ollama_port), "--ollama-keyless")
    proc.ollama_url = f"http://127.0.0.1:{ollama_port}"
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


def _text(r: dict) -> str:
    return r.get("response") or (r.get("message") or {}).get("content") or r["choices"][0]["message"]["content"]


@pytest.mark.slow
@pytest.mark.parametrize("path,body", [("/api/generate", GENERATE), ("/api/chat", CHAT),
                                       ("/v1/chat/completions", OPENAI)])
def test_curl_d_is_answered_as_json_is(server, path, body):
    want = httpx.post(server.base_url + path, headers=server.headers, json=body, timeout=120)
    assert want.status_code == 200, want.text
    got = _curl(server.base_url + path, body, f"Authorization: Bearer {server.api_key}")
    assert "error" not in got, got
    assert _text(got) == _text(want.json()) and _text(got)
    bare = _curl(server.ollama_url + path, body)  # Ollama's documented form: no type, no key
    assert "error" not in bare, bare
    assert _text(bare) == _text(want.json())
    refused = _curl(server.base_url + path, body)  # Ember's own port still asks for the key
    assert refused["error"]["code"] == "invalid_api_key"


@pytest.mark.slow
@pytest.mark.parametrize("content_type", [None, "text/plain"])
def test_httpx_without_a_json_type(server, content_type):
    headers = {**server.headers, **({"Content-Type": content_type} if content_type else {})}
    r = httpx.post(server.base_url + "/api/chat", headers=headers, content=json.dumps(CHAT).encode(), timeout=120)
    assert r.status_code == 200 and r.json()["message"]["content"], r.text


@pytest.mark.slow
def test_the_ollama_client_without_a_key(server):
    ollama = pytest.importorskip("ollama")
    there = ollama.Client(host=server.ollama_url, timeout=120)
    r = there.chat(model="model", messages=CHAT["messages"], options=GREEDY)
    assert r.message.content == ollama.Client(host=server.base_url, headers=server.headers, timeout=120).chat(
        model="model", messages=CHAT["messages"], options=GREEDY).message.content
    assert [m.model for m in there.list().models]  # every route, not just the chat
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=server.base_url, timeout=120).chat(model="model", messages=CHAT["messages"])
    assert e.value.status_code == 401


@pytest.mark.slow
@pytest.mark.parametrize("headers,code", [({"Origin": "https://evil.example"}, "forbidden_origin"),
                                          ({"Origin": "null"}, "forbidden_origin"),
                                          ({"Host": "evil.example"}, "forbidden_host"),
                                          ({"Host": "192.168.1.5:11434"}, "forbidden_host")])
def test_web_pages_still_cannot_reach_the_keyless_port(server, headers, code):
    r = httpx.post(server.ollama_url + "/api/chat", headers={"Content-Type": "text/plain", **headers},
                   content=json.dumps(CHAT).encode(), timeout=30)
    assert r.status_code == 403 and r.json()["error"]["code"] == code, r.text
