"""Fast, in-process checks of the server app (the real create_app over ASGI, no model loaded):
error shapes, auth, Host/Origin, the context arithmetic and the metrics exposition."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from engine.server.app import ServerSettings, create_app
from engine.server.auth import SecurityPolicy, check_bind, host_name, is_loopback
from engine.service.engine_thread import EngineThread
from engine.server.errors import APIError
from engine.service.loading import make_engine_factory
from engine.service.metrics import Metrics
from engine.server.serving import fit_context

KEY = "test-key-123"
H = {"Authorization": f"Bearer {KEY}"}


def _call(method: str, path: str, **kw) -> httpx.Response:
    app = create_app(EngineThread(make_engine_factory()), ServerSettings(api_key=KEY))

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8765") as c:
            return await c.request(method, path, **kw)
    return asyncio.run(go())


def _err(r: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"]
    if code is not None:
        assert e["code"] == code, e
    if param is not None:
        assert e["param"] == param, e
    return e


CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("method,path,kw,status,code,param", [
    ("GET", "/nope", {}, 404, "not_found", None),
    ("DELETE", "/v1/models", {}, 405, "method_not_allowed", None),
    ("POST", "/v1/chat/completions", {"content": b"{bad", "headers": {"content-type": "application/json"}}, 400, "invalid_json", None),
    ("POST", "/v1/chat/completions", {"json": [1, 2]}, 400, "invalid_json", None),
    ("POST", "/v1/chat/completions", {"json": {**CHAT, "temperature": 2.5}}, 400, "invalid_value", "temperature"),
    ("POST", "/v1/chat/completions", {"json": {**CHAT, "n": 17}}, 400, "invalid_value", "n"),
    ("POST", "/v1/chat/completions", {"json": {**CHAT, "top_logprobs": 2}}, 400, "invalid_value", None),
    ("POST", "/v1/chat/completions", {"json": {"messages": []}}, 400, "invalid_value", "messages"),
    ("POST", "/v1/chat/completions", {"json": {"messages": [{"role": "robot", "content": "x"}]}}, 400, "invalid_value", None),
    ("POST", "/v1/chat/completions", {"json": {**CHAT, "stop": ["a"] * 17}}, 400, "invalid_value", "stop"),
    ("POST", "/v1/chat/completions", {"json": {**CHAT, "seed": 2**70}}, 400, "invalid_value", "seed"),
    ("POST", "/v1/completions", {"json": {"prompt": []}}, 400, "invalid_value", "prompt"),
    ("POST", "/v1/completions", {"json": {"prompt": [-1]}}, 400, "invalid_value", None),
    ("POST", "/v1/completions", {"json": {"prompt": "x", "logprobs": 21}}, 400, "invalid_value", "logprobs"),
    ("POST", "/v1/completions", {"json": {"prompt": "x"}}, 503, "model_not_loaded", None),
    ("POST", "/v1/engine/load", {"json": {"model": "../../etc"}}, 400, "invalid_value", "model"),
    ("POST", "/v1/engine/load", {"json": {"model": "not-installed"}}, 404, "model_not_found", "model"),
])
def test_errors_have_openai_shape(method, path, kw, status, code, param):
    headers = {**H, **kw.pop("headers", {})}
    _err(_call(method, path, headers=headers, **kw), status, code, param)


def test_auth_host_origin():
    _err(_call("GET", "/v1/models"), 401, "invalid_api_key")
    _err(_call("GET", "/v1/models", headers={"Authorization": "Bearer wrong"}), 401, "invalid_api_key")
    _err(_call("GET", "/v1/models", headers={**H, "Host": "attacker.example"}), 403, "forbidden_host")
    _err(_call("GET", "/v1/models", headers={**H, "Origin": "https://attacker.example"}), 403, "forbidden_origin")
    assert _call("GET", "/health").json()["status"] == "unloaded"
    assert _call("GET", "/v1/models", headers=H).json() == {"object": "list", "data": []}


def test_fit_context():
    ids = list(range(100))
    assert fit_context(ids, None, None, 128) == (ids, 28)  # chat default: what fits
    assert fit_context(ids, 10, None, 128) == (ids, 10)
    with pytest.raises(APIError) as e:
        fit_context(ids, 40, None, 128)
    assert e.value.code == "context_length_exceeded" and e.value.param == "max_tokens"
    with pytest.raises(APIError) as e:
        fit_context(list(range(200)), None, None, 128)
    assert e.value.code == "context_length_exceeded" and e.value.status == 400
    kept, m = fit_context(list(range(200)), 40, -1, 128)  # keep the last tokens that leave room
    assert kept == list(range(112, 200)) and m == 40
    kept, m = fit_context(list(range(200)), None, 50, 128)
    assert kept == list(range(150, 200)) and m == 78


def test_metrics_exposition():
    m = Metrics()
    m.requests.inc(endpoint="/v1/completions", status="200")
    for v in (0.01, 0.2, 3.0, 100.0):
        m.ttft.observe(v)
    m.on_step(batch_size=4, new_tokens=4, seconds=0.01)
    text = m.render()
    assert 'ember_requests_total{endpoint="/v1/completions",status="200"} 1' in text
    buckets = [float(x.split()[-1]) for x in text.splitlines() if x.startswith("ember_time_to_first_token_seconds_bucket")]
    assert buckets == sorted(buckets) and buckets[-1] == 4 and buckets[0] == 1
    assert 'le="+Inf"' in text and "ember_time_to_first_token_seconds_count 4" in text
    assert "ember_generation_tokens_total 4" in text and "ember_speculative" not in text


def test_policy_units():
    assert host_name("[::1]:80") == "::1" and host_name("localhost:8765") == "localhost"
    assert is_loopback("127.0.0.2") and is_loopback("::1") and not is_loopback("10.0.0.1")
    check_bind("127.0.0.1", False, None)
    check_bind("0.0.0.0", True, "k" * 16)
    with pytest.raises(ValueError):
        check_bind("192.168.0.2", False, "key")
    with pytest.raises(ValueError):
        check_bind("0.0.0.0", True, None)
    p = SecurityPolicy.build("secret")
    assert p.key_ok("Bearer secret") and p.key_ok("bearer secret")
    assert not p.key_ok("Bearer secret2") and not p.key_ok(None) and not p.key_ok("secret")
    remote = SecurityPolicy.build("k", allowed_hosts=["box.lan"])
    assert remote.host_allowed("box.lan:8765") and not remote.host_allowed("other.lan")
