"""Every catalog entry is a model some runner of Ember runs, has the fields the schema needs, and
the catalog names today's desktop families (Qwen3, Gemma 3, Llama, Phi, SmolLM3, gpt-oss)."""
from __future__ import annotations

import importlib.resources
import json

import pytest

from app.api_pull import resolve
from app.catalog import DEFAULT_HUB, Catalog, CatalogEntry, CatalogFile
from engine.model_files.architectures import (EMBEDDING_ARCHITECTURES, EMBER_ARCHITECTURES, LLAMA_CPP_ARCHITECTURES,
                                              embeds_only, llama_cpp_runs)
from engine.model_files.fit import FORMATS
from engine.model_files.families import hf_family

REQUIRED = {name for name, f in CatalogEntry.__dataclass_fields__.items()
            if name != "hub_base_url"}  # the fields to_dict writes: every entry spells all of them
FILE_FIELDS = set(CatalogFile.__dataclass_fields__)


@pytest.fixture(scope="module")
def doc():
    return json.loads(importlib.resources.files("resources").joinpath("catalog.json").read_text("utf-8"))


@pytest.fixture(scope="module")
def catalog():
    return Catalog.load()


def test_the_list_is_llama_cpps_table_less_what_does_not_generate_text():
    assert EMBER_ARCHITECTURES <= LLAMA_CPP_ARCHITECTURES  # llama.cpp runs the torch engine's too
    for arch in ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "gpt-oss", "phi3", "smollm3", "mistral3"):
        assert llama_cpp_runs(arch), arch
    for arch in ("(unknown)", "clip", "gptj", "t5encoder", "llama-embed", "eagle3", "mistral", ""):
        assert not llama_cpp_runs(arch), arch
    assert all(a == a.strip() and a for a in LLAMA_CPP_ARCHITECTURES)
    # encoders load as embedding models (embeddings only), never as text generators
    assert not EMBEDDING_ARCHITECTURES & LLAMA_CPP_ARCHITECTURES
    for arch in ("bert", "nomic-bert", "jina-bert-v2", "gemma-embedding"):
        assert llama_cpp_runs(arch) and embeds_only(arch), arch
    assert not embeds_only("llama") and not embeds_only("qwen3")


def test_every_entry_runs_on_a_runner_of_ember(catalog):
    for e in catalog:
        if e.format == "gguf":  # general.architecture: llama.cpp, or Ember's engine (a subset)
            assert llama_cpp_runs(e.architecture), (e.id, e.architecture)
        else:  # config.json model_type: only Ember's engine reads GPTQ/AWQ directories
            family = hf_family(e.architecture)
            assert family is not None and family.name in EMBER_ARCHITECTURES, (e.id, e.architecture)


def test_every_entry_has_the_schemas_fields(doc, catalog):
    assert doc["version"] == 1 and doc["about"]
    for d in doc["models"]:
        assert set(d) == REQUIRED, (d.get("id"), set(d) ^ REQUIRED)
        assert d["files"] and all(set(f) == FILE_FIELDS for f in d["files"]), d["id"]
        for key in ("id", "name", "family", "parameters", "architecture", "quantization", "repo",
                    "revision", "license"):
            assert isinstance(d[key], str) and d[key], (d["id"], key)
        for key in ("context_length", "num_layers", "num_kv_heads", "head_dim"):
            assert isinstance(d[key], int) and d[key] > 0, (d["id"], key)
        assert d["format"] in FORMATS
    assert len(catalog) == len(doc["models"])


def test_ids_are_unique(doc):
    ids = [d["id"] for d in doc["models"]]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def test_names_todays_desktop_families(catalog):
    archs = {e.architecture for e in catalog}
    assert {"qwen3", "gemma3", "llama", "phi3", "smollm3", "gpt-oss"} <= archs
    for family, sizes in [("Qwen3", {"0.6B", "1.7B", "4B", "8B"}), ("Gemma 3", {"1B", "4B"}),
                          ("Llama 3.1", {"8B"}), ("Llama 3.2", {"1B", "3B"})]:
        assert sizes <= {e.parameters for e in catalog if e.family == family}, family
    gpt_oss = [e for e in catalog if e.architecture == "gpt-oss"]
    assert gpt_oss and all(e.quantization == "MXFP4" and e.format == "gguf" for e in gpt_oss)


def test_names_the_30b_mixtures_of_experts_that_fit_24_gb(catalog):
    """Qwen3-30B-A3B Instruct 2507 and Qwen3-Coder-30B-A3B at Q4_K_M (unsloth's files; sizes and
    hashes null: the pull asks the hub's metadata), on Ember's engine, estimated under 24 GB."""
    moe = {e.id: e for e in catalog if e.architecture == "qwen3moe"}
    assert set(moe) == {"qwen3-30b-a3b-instruct-2507-q4_k_m", "qwen3-coder-30b-a3b-instruct-q4_k_m"}
    assert "qwen3moe" in EMBER_ARCHITECTURES
    e = moe["qwen3-coder-30b-a3b-instruct-q4_k_m"]
    assert e.url == ("https://huggingface.co/unsloth/Qwen3-Coder-30B-A3B-Instruct-GGUF/resolve/main/"
                     "Qwen3-Coder-30B-A3B-Instruct-Q4_K_M.gguf")
    assert moe["qwen3-30b-a3b-instruct-2507-q4_k_m"].file == "Qwen3-30B-A3B-Instruct-2507-Q4_K_M.gguf"
    for e in moe.values():
        assert e.quantization == "Q4_K_M" and e.sha256 is None and e.size_bytes is None and not e.suggested_draft
        assert (e.num_layers, e.num_kv_heads, e.head_dim, e.context_length) == (48, 4, 128, 262144)
        assert 17e9 < e.estimated_size_bytes < 20e9  # the real files are about 18.6 GB
    # Ollama's names for them pull these entries (app/api_pull.py: family:size, Q4_K_M)
    assert resolve("qwen3-coder:30b", catalog, DEFAULT_HUB).id == "qwen3-coder-30b-a3b-instruct-q4_k_m"
    assert resolve("qwen3:30b", catalog, DEFAULT_HUB).id == "qwen3-30b-a3b-instruct-2507-q4_k_m"
    assert [e.id for e in catalog.search("30b a3b")] == sorted(moe)
