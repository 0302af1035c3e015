"""Ollama's /api/pull through the official `ollama` client against a real engine process, which
downloads with the app's DownloadManager from a local fake of the hub (the one fake allowed: no
hub can be reached here; tests/hub_api_fake.py, huggingface_hub's HfApi reads it).

Oracles we did not write: the `ollama` client's parsing of the progress stream and its errors,
and sha256 of the bytes the hub served against the manifest the download wrote.
"""
from __future__ import annotations

import asyncio
import hashlib

import httpx
import pytest
from hub_api_fake import add_repo
from server_util import start_engine, tiny_model
from store_helpers import FakeHub, Fault, write_tiny_gguf

from app.catalog import Catalog
from engine.server.errors import APIError
from engine.server.ollama.pull import pull_reply

ollama = pytest.importorskip("ollama")

pytestmark = pytest.mark.slow
REPO = "acme/Tiny-0.5B-GGUF"
CATALOG_ID = "qwen3-0.6b-q4_k_m"  # no size or sha256 in the catalog: the downloader records them


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    d = tmp_path_factory.mktemp("hubfiles")
    files = {"tiny-0.5b-Q4_K_M.gguf": write_tiny_gguf(d / "a.gguf", seed=1).read_bytes(),
             "tiny-0.5b-Q8_0.gguf": write_tiny_gguf(d / "b.gguf", seed=2).read_bytes()}
    with FakeHub() as server:
        add_repo(server, REPO, files)
        entry = Catalog.load().get(CATALOG_ID)
        server.add(entry.repo, entry.file, write_tiny_gguf(d / "c.gguf", seed=3).read_bytes())
        add_repo(server, "acme/Broken-GGUF", {"broken-Q4_K_M.gguf": b"GGUF" + b"\0" * 64})
        server.faults["/acme/Broken-GGUF/resolve/main/broken-Q4_K_M.gguf"] = Fault(status=404)
        server.data = files
        yield server


@pytest.fixture(scope="module")
def server(hub, tiny_model_factory, tmp_path_factory):
    home, store = tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("store")
    with pytest.MonkeyPatch.context() as mp:  # the engine reads the app's settings from its environment
        mp.setenv("EMBER_HOME", str(home))
        mp.setenv("EMBER_HUB_BASE_URL", hub.base_url)
        proc = start_engine(tiny_model(tiny_model_factory), tmp_path_factory.mktemp("srv"),
                            "--models-dir", str(store))
    proc.store = store
    yield proc
    proc.stop()


@pytest.fixture()
def client(server):
    return ollama.Client(host=server.base_url, headers={"Authorization": f"Bearer {server.api_key}"}, timeout=120)


def test_pull_a_hub_gguf_streamed_then_listed(client, hub, server):
    data = hub.data["tiny-0.5b-Q8_0.gguf"]
    sha = hashlib.sha256(data).hexdigest()
    lines = list(client.pull(f"hf.co/{REPO}:Q8_0", stream=True))
    statuses = [p.status for p in lines]
    assert statuses[0] == "pulling manifest" and statuses[-3:] == ["verifying sha256 digest", "writing manifest",
                                                                   "success"]
    layer = [p for p in lines if p.status == f"pulling {sha[:12]}"]
    assert layer and all(p.digest == f"sha256:{sha}" and p.total == len(data) for p in layer)
    assert layer[-1].completed == len(data)
    assert [c.completed for c in layer] == sorted(c.completed for c in layer)
    tags = {m.model: m for m in client.list().models}
    assert tags["tiny-0.5b-q8_0:latest"].digest == sha and tags["tiny-0.5b-q8_0:latest"].size == len(data)
    assert client.show("tiny-0.5b-q8_0").details.family == "llama"
    again = list(client.pull(f"hf.co/{REPO}:Q8_0", stream=True))  # installed: nothing downloads
    assert [p.status for p in again] == ["pulling manifest", "success"]


def test_pull_by_ollama_name_from_the_catalog_not_streamed(client, hub):
    r = client.pull("qwen3:0.6b")  # Ollama's family:size, Q4_K_M as Ollama's default
    assert r.status == "success"
    entry = Catalog.load().get(CATALOG_ID)
    sha = hashlib.sha256(hub.files[f"/{entry.repo}/resolve/main/{entry.file}"]).hexdigest()
    assert {m.model: m.digest for m in client.list().models}[f"{CATALOG_ID}:latest"] == sha
    # the hub's default quantization where none is named
    assert client.pull(f"hf.co/{REPO}").status == "success"
    assert "tiny-0.5b-q4_k_m:latest" in {m.model for m in client.list().models}


def test_pull_errors_in_ollamas_shape_and_the_server_keeps_serving(client, server):
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("no-such-model:7b")
    assert e.value.status_code == 404 and "not in Ember's catalog" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.pull(f"hf.co/{REPO}:Q2_K")
    assert e.value.status_code == 404 and "no Q2_K" in e.value.error and "Q8_0" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("hf.co/not-a-repo")
    assert e.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as e:  # the file is gone from the hub: the stream's last line
        list(client.pull("hf.co/acme/Broken-GGUF", stream=True))
    assert "404" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:  # not streamed: Ollama's 500
        client.pull("hf.co/acme/Broken-GGUF")
    assert e.value.status_code == 500 and "404" in e.value.error
    auth = {"Authorization": f"Bearer {server.api_key}"}
    r = httpx.post(server.base_url + "/api/pull", headers=auth, json={"stream": False})
    assert r.status_code == 400 and r.json() == {"error": "model is required"}
    assert httpx.post(server.base_url + "/api/pull", json={"model": "qwen3:0.6b"}).status_code == 401
    assert "broken-q4_k_m:latest" not in {m.model for m in client.list().models}  # nothing half-done
    assert client.chat(client.ps().models[0].model, messages=[{"role": "user", "content": "hi"}],
                       options={"num_predict": 2}).done


def test_a_server_without_the_apps_downloads_says_so():
    """`python -m engine serve` has no download manager (the engine must not import the app's)."""
    with pytest.raises(APIError) as e:
        asyncio.run(pull_reply(None, "qwen3:0.6b", False, None))
    assert e.value.status == 501 and "ember models pull" in str(e.value)
