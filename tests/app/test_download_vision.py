"""A vision model from the catalog: `ember models pull ID` fetches the model and its projector from
a local server that speaks the hub's API (tests/hub_api_fake.py), checks each file against the
size and sha256 the hub's metadata gives (the catalog has none), and registers them paired; a
projector whose bytes are not what the hub says fails the pull with nothing left behind; an M-RoPE
vision model of a kind not supported yet (Qwen3-VL) is refused before a byte is fetched;
Qwen2.5-VL's (LM architecture qwen2vl) is not. The bundled
catalog names today's small VLMs with both files."""
from __future__ import annotations

import json

import pytest

from app.catalog import Catalog
from app.cli import main
from app.store import ModelStore, sha256_file
from hub_api_fake import add_repo
from store_helpers import FakeHub, sha256
from vlm_factory import write_tiny_vlm

REPO = "ggml-org/tiny-vlm-GGUF"


def vlm_entry(model_id: str, arch: str = "gemma3") -> dict:
    return {"id": model_id, "name": "Tiny VLM", "family": "Test", "parameters": "1M", "architecture": arch,
            "quantization": "F32", "format": "gguf", "repo": REPO, "revision": "main", "license": "apache-2.0",
            "files": [{"name": "lm.gguf", "size_bytes": None, "sha256": None},
                      {"name": "mmproj-model-f16.gguf", "size_bytes": None, "sha256": None}],
            "mmproj": "mmproj-model-f16.gguf"}


@pytest.fixture
def setup(tmp_path, monkeypatch):
    vlm = write_tiny_vlm(tmp_path / "files")
    files = {"lm.gguf": vlm.model.read_bytes(), "mmproj-model-f16.gguf": vlm.mmproj.read_bytes()}
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps({"version": 1, "about": "test", "models": [
        vlm_entry("tiny-vlm"), vlm_entry("tiny-qwen-vl", arch="qwen3vl"),
        vlm_entry("tiny-qwen25-vl", arch="qwen2vl")]}))
    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "home"))
    with FakeHub() as hub:
        add_repo(hub, REPO, files)
        yield hub, files, catalog, ModelStore(tmp_path / "home" / "data" / "models")


def pull(hub, catalog, model_id: str) -> int:
    return main(["models", "pull", model_id, "--catalog", str(catalog), "--hub-base-url", hub.base_url,
                 "--no-progress"])


def test_a_pull_fetches_verifies_and_pairs_both_files(setup, capsys):
    hub, files, catalog, store = setup
    assert pull(hub, catalog, "tiny-vlm") == 0, capsys.readouterr().err
    assert "with its projector" in capsys.readouterr().out
    m = store.get("tiny-vlm")
    assert m.sha256 == sha256(files["lm.gguf"]) and m.mmproj_sha256 == sha256(files["mmproj-model-f16.gguf"])
    assert m.mmproj == str(store.root / "tiny-vlm" / "mmproj-model-f16.gguf")
    assert sha256_file(m.mmproj) == m.mmproj_sha256 and store.verify("tiny-vlm")
    assert hub.ranges(f"/{REPO}/resolve/main/mmproj-model-f16.gguf")  # fetched from the hub
    assert not list(store.root.rglob("*.part"))


def test_a_projector_that_is_not_what_the_hub_says_fails_the_pull(setup, capsys):
    hub, files, catalog, store = setup
    good = files["mmproj-model-f16.gguf"]
    hub.files[f"/{REPO}/resolve/main/mmproj-model-f16.gguf"] = good[:-8] + b"\1" * 8
    assert pull(hub, catalog, "tiny-vlm") == 1
    err = capsys.readouterr().err
    assert "mmproj-model-f16.gguf: sha256 mismatch" in err and sha256(good) in err
    assert store.get("tiny-vlm") is None and not (store.root / "tiny-vlm").exists()


def test_an_mrope_vision_model_is_refused_before_a_byte(setup, capsys):
    hub, _, catalog, store = setup
    assert pull(hub, catalog, "tiny-qwen-vl") == 2
    assert "not supported yet" in capsys.readouterr().err
    assert not [p for p, _ in hub.requests if "/resolve/" in p] and store.get("tiny-qwen-vl") is None
    assert pull(hub, catalog, "tiny-qwen25-vl") == 0, capsys.readouterr().err  # Qwen2.5-VL's M-RoPE runs


def test_the_catalog_names_todays_small_vlms_with_both_files():
    catalog = Catalog.load()
    vlms = {e.id: e for e in catalog if e.mmproj}
    assert set(vlms) == {"gemma-3-4b-it-vision-q4_k_m", "qwen2.5-vl-3b-instruct-q4_k_m", "qwen2.5-vl-7b-instruct-q4_k_m",
                         "smolvlm2-2.2b-instruct-q4_k_m", "smolvlm2-500m-video-instruct-q8_0"}
    for e in vlms.values():
        assert e.repo.startswith("ggml-org/") and [f.name for f in e.files][1] == e.mmproj
        assert e.mmproj.startswith("mmproj-") and not e.file.startswith("mmproj")
    assert vlms["gemma-3-4b-it-vision-q4_k_m"].files[1].name == "mmproj-model-f16.gguf"


def test_a_hub_pull_with_mmproj_pairs_the_repos_projector(setup, capsys):
    """`ember models pull FILE --hub REPO --mmproj NAME`: the hub's own repo listing gives both files'
    facts; without --mmproj the pull says the repo has projectors."""
    hub, files, _, store = setup
    flags = ["--hub", REPO, "--hub-base-url", hub.base_url, "--no-progress"]
    with pytest.raises(SystemExit, match="has no projector 'nope.gguf'; it has: mmproj-model-f16.gguf"):
        main(["models", "pull", "lm.gguf", *flags, "--mmproj", "nope.gguf"])
    assert main(["models", "pull", "lm.gguf", *flags, "--mmproj", "mmproj-model-f16.gguf"]) == 0
    m = store.get("lm")
    assert m.mmproj_sha256 == sha256(files["mmproj-model-f16.gguf"]) and store.verify("lm")
    main(["models", "rm", "lm"])
    capsys.readouterr()
    assert main(["models", "pull", "lm.gguf", *flags]) == 0
    assert "add --mmproj FILE" in capsys.readouterr().err and store.get("lm").mmproj is None
