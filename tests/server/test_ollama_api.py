"""Ollama's native API (/api/*) through the official `ollama` client against a real engine process.

Oracles we did not write: the `ollama` client's parsing of every response and error, jsonschema
for structured output, and the engine's own greedy decoding on /v1/chat/completions (the same
request through Ollama's API must give the same text, streamed or not).
"""
from __future__ import annotations

import hashlib
import json
import socket

import httpx
import jsonschema
import openai
import pytest
from server_util import start_engine, tiny_model

from engine.model_files.manifest import ModelManifest, write_manifest
from engine.model_files.meta import read_meta

ollama = pytest.importorskip("ollama")

pytestmark = pytest.mark.slow

MSGS = [{"role": "user", "content": "Hello, how are you today?"}]
GREEDY = {"temperature": 0, "num_predict": 12}


@pytest.fixture(scope="module")
def server(tiny_model_factory, tmp_path_factory):
    """The tiny model served from a store (its manifest gives the digest), plus one more installed
    model that is not loaded."""
    path = tiny_model(tiny_model_factory)
    store = tmp_path_factory.mktemp("store")
    meta, data = read_meta(path), path.read_bytes()
    for mid in ("model", "other"):
        write_manifest(store, ModelManifest.from_meta(mid, path, meta, sha256=hashlib.sha256(data).hexdigest(),
                                                      size_bytes=len(data), source="import"))
    with socket.socket() as s:  # a free port for the second listener (Ollama's 11434 may be taken here)
        s.bind(("127.0.0.1", 0))
        ollama_port = s.getsockname()[1]
    proc = start_engine(path, tmp_path_factory.mktemp("srv"), "--models-dir", str(store),
                        "--ollama-port", str(ollama_port))
    proc.sha256 = hashlib.sha256(data).hexdigest()
    proc.ollama_url = f"http://127.0.0.1:{ollama_port}"
    yield proc
    proc.stop()


@pytest.fixture()
def client(server):
    return ollama.Client(host=server.base_url, headers={"Authorization": f"Bearer {server.api_key}"}, timeout=120)


def test_version_tags_show_ps(client, server):
    r = httpx.get(server.base_url + "/api/version", headers={"Authorization": f"Bearer {server.api_key}"})
    assert r.status_code == 200 and r.json()["version"]
    assert httpx.get(server.base_url + "/api/version").status_code == 401  # the same rules as /v1: key,
    auth = {"Authorization": f"Bearer {server.api_key}"}
    assert httpx.get(server.base_url + "/api/tags", headers=auth | {"Host": "evil.example"}).status_code == 403
    assert httpx.get(server.base_url + "/api/tags",  # Host and Origin
                     headers=auth | {"Origin": "https://evil.example"}).status_code == 403
    models = {m.model: m for m in client.list().models}
    assert set(models) == {"model:latest", "other:latest"}
    m = models["model:latest"]
    assert m.digest == server.sha256 and m.size > 0 and m.details.family == "llama"
    assert m.details.format == "gguf" and m.details.parameter_size and m.details.quantization_level
    s = client.show("model")
    assert s.details.family == "llama" and "completion" in s.capabilities
    assert s.modelinfo["general.architecture"] == "llama" and s.modelinfo["llama.context_length"] == 512
    assert "im_start" in s.template
    assert client.show("other:latest").details.family == "llama"  # installed, not loaded
    ps = client.ps().models
    assert [p.model for p in ps] == ["model:latest"] and ps[0].context_length == 512
    assert ps[0].digest == server.sha256


def test_the_ollama_port_serves_the_same_api_under_the_same_rules(server):
    """`--ollama-port` (the setting "Ollama's port too"): programs that expect Ollama at 11434."""
    auth = {"Authorization": f"Bearer {server.api_key}"}
    there = ollama.Client(host=server.ollama_url, headers=auth, timeout=120)
    assert {m.model for m in there.list().models} == {"model:latest", "other:latest"}
    r = there.chat(model="model", messages=MSGS, options=GREEDY)
    assert r.message.content == ollama.Client(host=server.base_url, headers=auth, timeout=120).chat(
        model="model", messages=MSGS, options=GREEDY).message.content
    assert httpx.get(server.ollama_url + "/api/tags").status_code == 401
    with pytest.raises(ollama.ResponseError) as e:  # without --ollama-keyless the key is asked for there too
        ollama.Client(host=server.ollama_url, timeout=120).chat(model="model", messages=MSGS, options=GREEDY)
    assert e.value.status_code == 401
    assert httpx.get(server.ollama_url + "/api/tags", headers=auth | {"Host": "evil.example"}).status_code == 403


def test_chat_stream_equals_non_stream_equals_openai(client, server):
    r = client.chat("model:latest", messages=MSGS, options=GREEDY, stream=False)
    assert r.done and r.done_reason in ("stop", "length") and r.message.role == "assistant"
    assert 0 < r.eval_count <= 12 and r.prompt_eval_count > 5
    assert r.total_duration >= r.eval_duration >= 0 and r.prompt_eval_duration > 0 and r.load_duration == 0
    chunks = list(client.chat("model", messages=MSGS, options=GREEDY, stream=True))
    assert all(not c.done for c in chunks[:-1]) and chunks[-1].done
    assert "".join(c.message.content or "" for c in chunks) == r.message.content
    assert chunks[-1].eval_count == r.eval_count and chunks[-1].done_reason == r.done_reason
    oa = openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0)
    ref = oa.chat.completions.create(model="model", messages=MSGS, max_tokens=12, temperature=0)
    assert ref.choices[0].message.content == r.message.content
    assert ref.usage.prompt_tokens == r.prompt_eval_count and ref.usage.completion_tokens == r.eval_count


def test_generate_templated_and_raw(client, server):
    g = client.generate("model", prompt="Hello, how are you today?", options=GREEDY)
    chat = client.chat("model", messages=MSGS, options=GREEDY)
    assert g.response == chat.message.content  # the prompt as a user turn
    raw = client.generate("model", prompt="Once upon a time", raw=True, options=GREEDY)
    oa = openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0)
    ref = oa.completions.create(model="model", prompt="Once upon a time", max_tokens=12, temperature=0)
    assert raw.response == ref.choices[0].text and raw.prompt_eval_count == ref.usage.prompt_tokens
    streamed = list(client.generate("model", prompt="Once upon a time", raw=True, options=GREEDY, stream=True))
    assert "".join(c.response for c in streamed) == raw.response and streamed[-1].done
    loaded = client.generate("model")  # an empty prompt: Ollama's "load the model"
    assert loaded.done and loaded.done_reason == "load"


def test_num_predict_and_format_schema(client):
    r = client.generate("model", prompt="Once upon a time", raw=True,
                        options={"temperature": 0, "num_predict": 3, "stop": []})
    assert r.eval_count == 3 and r.done_reason == "length"
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    r = client.chat("model", messages=[{"role": "user", "content": "A person as JSON."}], format=schema,
                    options={"temperature": 0.7, "seed": 1, "num_predict": 200})
    jsonschema.validate(json.loads(r.message.content), schema)
    # "json": any object; a random model may still be inside a string when num_predict runs out
    r = client.generate("model", prompt="JSON please", format="json", options={"temperature": 0, "num_predict": 20})
    assert r.response.startswith("{")
    if r.done_reason == "stop":
        assert isinstance(json.loads(r.response), dict)


def test_errors_in_ollamas_shape(client, server):
    with pytest.raises(ollama.ResponseError) as e:
        client.chat("nope:latest", messages=MSGS)
    assert e.value.status_code == 404 and e.value.error == "model 'nope:latest' not found"
    with pytest.raises(ollama.ResponseError) as e:
        client.show("nope")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        client.chat("model", messages=[{"role": "user", "content": "what is this?", "images": [b"\x89PNG"]}],
                    stream=False)
    assert e.value.status_code == 400 and "images" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.generate("model", prompt="hi", images=[b"\x89PNG"])
    assert e.value.status_code == 400 and "images" in e.value.error
    # installed, not loaded: loaded just in time beside the model that serves (issue 63)
    r = client.chat("other", messages=MSGS, stream=False, options={"num_predict": 2})
    assert r.done and r.model == "other:latest"
    headers = {"Authorization": f"Bearer {server.api_key}"}
    r = httpx.post(server.base_url + "/api/chat", headers=headers,
                   json={"model": "model", "messages": MSGS, "options": {"temperature": 5}})
    assert r.status_code == 400 and isinstance(r.json()["error"], str) and "temperature" in r.json()["error"]
    r = httpx.post(server.base_url + "/api/chat", headers=headers, json={"messages": MSGS})
    assert r.status_code == 400 and "model" in r.json()["error"]
    # accepted and ignored: keep_alive, num_ctx
    r = client.chat("model", messages=MSGS, options={"temperature": 0, "num_predict": 2, "num_ctx": 8192},
                    keep_alive=0)
    assert r.done and r.eval_count <= 2
