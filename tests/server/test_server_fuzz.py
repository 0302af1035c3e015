"""Fuzz a real server with schemathesis, from the app's own OpenAPI document: schema-valid and
schema-violating requests to every operation. No response may be a 5xx, every error must be in
OpenAI's shape, and the server must answer a plain request afterwards. Bounded to about a minute.
"""
from __future__ import annotations

import time

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from server_util import start_engine, tiny_model

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402

EXAMPLES = {GenerationMode.POSITIVE: 40, GenerationMode.NEGATIVE: 25}
BUDGET_S = {GenerationMode.POSITIVE: 15, GenerationMode.NEGATIVE: 10}  # per completions endpoint
# unload changes the server's state for every later case (a 503 "no model" would follow): it is
# tested on purpose in test_load_unload; the fuzzer still hits load with random ids.
SKIP = {("POST", "/v1/engine/unload")}

# every test here drives a real engine process (tens of seconds to start on 2 busy cores)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_model_factory, tmp_path_factory):
    # a short context keeps every generated reply short (max_tokens defaults to what fits)
    proc = start_engine(tiny_model(tiny_model_factory), tmp_path_factory.mktemp("fuzz"), "--max-model-len", "96")
    yield proc
    proc.stop()


def _check(case, r) -> None:
    """No 5xx; an error in the shape of the API the path belongs to (Ollama's, Anthropic's, OpenAI's)."""
    assert r.status_code < 500, f"{case.method} {case.path} -> {r.status_code}: {r.text[:500]}\nbody={case.body!r}"
    if r.status_code >= 400:
        body = r.json()
        if case.path.startswith("/api/"):
            assert isinstance(body["error"], str) and body["error"], f"{case.method} {case.path}: {r.text}"
        elif case.path.startswith("/v1/messages") and r.status_code not in (401, 403):  # the key check is OpenAI's
            assert body["type"] == "error" and {"type", "message"} <= set(body["error"]), r.text
        else:
            err = body["error"]
            assert {"message", "type", "param", "code"} <= set(err) and err["message"], r.text


def test_fuzz_openapi_no_5xx(server):
    doc = httpx.get(server.base_url + "/openapi.json", headers=server.headers, timeout=10).json()
    schema = schemathesis.openapi.from_dict(doc)
    session_headers = dict(server.headers)
    ran: dict[str, int] = {}
    ops = [r.ok() for r in schema.get_all_operations()]
    ops = [op for op in ops if (op.method.upper(), op.path) not in SKIP]
    for op in ops:
        for mode, n in EXAMPLES.items():
            # bounds the whole run to about 80 s
            t_end = time.monotonic() + (BUDGET_S[mode] if "completions" in op.path else 3)

            @settings(max_examples=n, deadline=None, database=None, derandomize=True,
                      phases=[Phase.explicit, Phase.generate],
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def fuzz(case):
                if time.monotonic() > t_end:
                    return
                r = case.call(base_url=server.base_url, headers=session_headers, timeout=60)
                _check(case, r)
                key = f"{op.method.upper()} {op.path} {mode.value}"
                ran[key] = ran.get(key, 0) + 1

            try:
                fuzz()
            except Unsatisfiable:  # no way to break the schema of an operation without inputs (or with a path id only)
                assert mode == GenerationMode.NEGATIVE and op.method.upper() in ("GET", "DELETE"), op.path
    print(ran)
    for path in ("/v1/chat/completions", "/v1/completions"):
        assert ran.get(f"POST {path} positive", 0) >= 10 and ran.get(f"POST {path} negative", 0) >= 10, ran
    # still serving, and holding no sequence
    r = httpx.post(server.base_url + "/v1/chat/completions", headers=server.headers, timeout=60,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 200, r.text
    s = httpx.get(server.base_url + "/v1/engine/status", headers=server.headers).json()
    assert s["status"] == "ready" and s["num_running"] == 0 and s["num_requests"] == 0


def test_load_unload(server):
    h = server.headers
    r = httpx.post(server.base_url + "/v1/engine/load", headers=h, json={"model": "../../etc/passwd"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = httpx.post(server.base_url + "/v1/engine/load", headers=h, json={"model": "not-installed"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert httpx.post(server.base_url + "/v1/engine/unload", headers=h).json()["status"] == "unloaded"
    # a request naming no model, with none loaded: the server's own model, loaded just in time
    r = httpx.post(server.base_url + "/v1/completions", headers=h, json={"prompt": "hi", "max_tokens": 2}, timeout=120)
    assert r.status_code == 200 and r.json()["model"] == server.health()["model"]
    assert httpx.post(server.base_url + "/v1/engine/unload", headers=h, json={}).json()["status"] == "unloaded"
    # the bundled default id loads without a store (the tiny model is not in one)
    r = httpx.post(server.base_url + "/v1/engine/load", headers=h, json={"model": "smollm2-135m-instruct-q4_1"},
                   timeout=300)
    assert r.status_code == 200 and r.json()["status"] == "ready", r.text
    r = httpx.post(server.base_url + "/v1/completions", headers=h, json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == "smollm2-135m-instruct-q4_1"


MSGS = [{"role": "user", "content": "hi"}]
FN = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
     "response_format"),  # an invalid schema
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}},
     "response_format"),  # a construct the grammar engine cannot enforce
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
     "tools.0.function.parameters"),  # a tool with a malformed schema
    ({"tools": [FN], "tool_choice": {"type": "function", "function": {"name": "g"}}}, None),  # unknown function
    ({"messages": MSGS + [{"role": "tool", "tool_call_id": "call_1", "content": "x"}]}, None),  # no such call
    ({"tools": [FN]}, "tools"),  # the tiny model's template has no tool support
    ({"n": 0}, "n"), ({"logit_bias": {"x": 1}}, "logit_bias"), ({"logit_bias": {"1": 500}}, "logit_bias"),
])
def test_bad_agent_requests_are_400s(server, extra, param):
    r = httpx.post(server.base_url + "/v1/chat/completions", headers=server.headers, timeout=60,
                   json={"messages": MSGS, "max_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if param is not None:
        assert err["param"] == param, err
    r = httpx.post(server.base_url + "/v1/chat/completions", headers=server.headers, timeout=60,
                   json={"messages": MSGS, "max_tokens": 2, "response_format": {"type": "json_object"}})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith("{"), r.text
