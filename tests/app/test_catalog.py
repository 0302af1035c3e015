"""The curated catalog: shape, URLs from the hub base URL, known hashes, drafts, search, and one
real entry downloaded end to end from a loopback hub and checked against the real bundled file."""
from __future__ import annotations

import importlib.resources
import json
import re

import pytest

from app.catalog import Catalog, CatalogError
from app.downloads import DownloadManager, RetryPolicy
from app.store import ModelStore
from store_helpers import bundled_model_or_skip, FakeHub

DESIGN_SHAS = {  # DESIGN.md "Offline facts"
    "smollm2-135m-instruct-q4_1": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "qwen2.5-coder-1.5b-instruct-q4_k_m": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    "qwen2.5-coder-0.5b-instruct-q4_k_m": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
}


@pytest.fixture(scope="module")
def catalog():
    return Catalog.load()


def test_covers_the_curated_families_and_formats(catalog):
    names = {(e.family, e.parameters) for e in catalog}
    for want in [("SmolLM2", "135M"), ("SmolLM2", "360M"), ("SmolLM2", "1.7B"), ("Qwen2.5", "0.5B"),
                 ("Qwen2.5", "1.5B"), ("Qwen2.5", "3B"), ("Qwen2.5", "7B"), ("Qwen2.5-Coder", "0.5B"),
                 ("Qwen2.5-Coder", "1.5B"), ("Llama 3.2", "1B"), ("Llama 3.2", "3B"), ("Mistral", "7B"),
                 ("Gemma 3", "1B"), ("Gemma 3", "4B")]:
        assert want in names
    assert {e.format for e in catalog} == {"gguf", "gptq", "awq"}
    for e in catalog:
        assert e.license and e.repo.count("/") == 1
        assert e.num_layers and e.num_kv_heads and e.head_dim and e.context_length


def test_hashes_are_the_known_ones_or_null(catalog):
    shas = {e.id: f.sha256 for e in catalog for f in e.files if f.sha256}
    assert shas == DESIGN_SHAS  # nothing else is claimed: unknown hashes stay null
    for e in catalog:
        for f in e.files:
            assert f.size_bytes is None or f.size_bytes > 0


def test_urls_follow_the_hub_base_url(catalog):
    e = Catalog.load(hub_base_url="http://127.0.0.1:9/mirror/").get("qwen2.5-1.5b-instruct-q4_k_m")
    assert e.url == ("http://127.0.0.1:9/mirror/Qwen/Qwen2.5-1.5B-Instruct-GGUF/resolve/main/"
                     "qwen2.5-1.5b-instruct-q4_k_m.gguf")
    assert catalog.get("qwen2.5-1.5b-instruct-q4_k_m").url.startswith("https://huggingface.co/Qwen/")
    assert catalog.with_hub("https://hf-mirror.example").entries[0].url.startswith("https://hf-mirror.example/")
    with pytest.raises(CatalogError, match="http"):
        Catalog.load(hub_base_url="file:///etc")


def test_suggested_drafts_are_smaller_models_of_the_same_vocabulary(catalog):
    def billions(p):
        return float(p[:-1]) / (1000 if p.endswith("M") else 1)

    drafts = [(e, catalog.get(e.suggested_draft)) for e in catalog if e.suggested_draft]
    assert len(drafts) >= 8
    for big, small in drafts:
        assert billions(small.parameters) < billions(big.parameters)
        # the family's first word: Qwen2.5-Coder drafts with Qwen2.5, Llama 3.1 with Llama 3.2
        assert big.family.split()[0].split("-")[0] == small.family.split()[0].split("-")[0]
        assert big.architecture == small.architecture
    no_small_sibling = {"Mistral", "Phi-4", "SmolLM3", "DeepSeek-R1", "gpt-oss"}  # none shares their vocabulary
    # a mixture of experts suggests none: verifying k drafted tokens reads each one's own experts,
    # so on a CPU the verify step costs nearly k decodes' bytes and a draft saves little
    experts = {"qwen3moe", "qwen2moe", "gpt-oss"}
    for e in catalog:  # every larger model with a same-vocabulary small sibling suggests one
        # a vision model's draft would not see its images: vision entries suggest none
        if billions(e.parameters) >= 1.5 and e.family not in no_small_sibling and not e.mmproj \
                and e.architecture not in experts:
            assert e.suggested_draft, e.id


def test_search(catalog):
    assert [e.id for e in catalog.search("qwen coder")] == ["qwen2.5-coder-0.5b-instruct-q4_k_m",
                                                             "qwen2.5-coder-1.5b-instruct-q4_k_m",
                                                             "qwen3-coder-30b-a3b-instruct-q4_k_m"]
    assert [e.id for e in catalog.search("qwen3moe")] == ["qwen3-30b-a3b-instruct-2507-q4_k_m",
                                                           "qwen3-coder-30b-a3b-instruct-q4_k_m"]
    assert [e.id for e in catalog.search("30B-A3B instruct 2507")] == ["qwen3-30b-a3b-instruct-2507-q4_k_m"]
    assert {e.format for e in catalog.search("awq")} == {"awq"}
    assert catalog.search("no-such-model") == []
    assert len(catalog.search("")) == len(catalog)


@pytest.mark.parametrize("change, problem", [
    (lambda d: d["files"][0].update(sha256="ABC"), "sha256"),
    (lambda d: d["files"][0].update(name="../../etc/passwd"), "unsafe"),
    (lambda d: d.update(id="Bad Id"), "invalid model id"),
    (lambda d: d.update(format="exl2"), "format"),
    (lambda d: d.update(suggested_draft="missing"), "suggested_draft"),
])
def test_bad_catalogs_are_refused(tmp_path, change, problem):
    doc = json.loads(importlib.resources.files("resources").joinpath("catalog.json").read_text("utf-8"))
    change(doc["models"][0])
    p = tmp_path / "c.json"
    p.write_text(json.dumps(doc))
    with pytest.raises((CatalogError, ValueError), match=problem):
        Catalog.load(p)


def test_bundled_entry_matches_the_real_file_and_downloads_end_to_end(tmp_path):
    bundled_model_or_skip()
    from engine.model_files.bundled import default_model_path
    from engine.model_files.meta import read_gguf_meta

    path = default_model_path()
    meta = read_gguf_meta(path)
    with FakeHub() as hub:
        entry = Catalog.load(hub_base_url=hub.base_url).get("smollm2-135m-instruct-q4_1")
        assert entry.size_bytes == path.stat().st_size
        assert (entry.architecture, entry.quantization) == (meta.architecture, meta.quantization)
        assert (entry.num_layers, entry.num_kv_heads, entry.head_dim) == (meta.num_layers, meta.num_kv_heads,
                                                                          meta.head_dim)
        served = re.sub(r"^https?://[^/]+", "", entry.url)
        hub.files[served] = path.read_bytes()
        store = ModelStore(tmp_path / "models")
        dm = DownloadManager(store, tmp_path / "state", hub.base_url, retry=RetryPolicy(attempts=2, backoff_s=0.01))
        final = dm.wait(dm.start(entry), timeout=60)
        assert final.state == "done", final.error
        m = store.get(entry.id)
        assert m.sha256 == entry.sha256 and m.source == "download" and m.parameter_count == meta.parameter_count
