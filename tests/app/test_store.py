"""ModelStore: metadata from the file itself, imports (copy/move/link), verify, delete, the bundled default."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.store import DEFAULT_MODEL_ID, ModelFileError, ModelStore, sha256_file
from engine.model_files.meta import read_meta
from store_helpers import bundled_model_or_skip, gptq_dir_params, tiny_gguf_params, write_gptq_dir, write_tiny_gguf

MANIFEST_KEYS = {"id", "name", "path", "format", "architecture", "sha256", "size_bytes", "context_length",
                 "quantization", "parameter_count", "source", "added_at"}


@pytest.fixture
def store(tmp_path):
    return ModelStore(tmp_path / "models")


def test_import_reads_metadata_from_the_file_not_its_name(store, tmp_path):
    # the name lies about everything: architecture, size and quant all come from the header
    src = write_tiny_gguf(tmp_path / "qwen2-7b-instruct-Q8_0.gguf", name="Tiny Test", pad_mb=0.25, file_type=1)
    m = store.import_path(src)
    assert m.architecture == "llama"
    assert m.parameter_count == tiny_gguf_params(0.25)
    assert m.context_length == 512
    assert m.quantization == "F16"  # general.file_type 1 = MOSTLY_F16, whatever the tensors are
    assert (m.num_layers, m.num_kv_heads, m.head_dim) == (2, 2, 16)
    assert m.format == "gguf" and m.source == "import"
    assert m.sha256 == sha256_file(src) and m.size_bytes == src.stat().st_size
    assert m.id == "tiny-test-f16"
    on_disk = json.loads((store.root / m.id / "manifest.json").read_text())
    assert MANIFEST_KEYS <= on_disk.keys()
    assert on_disk["path"] == str(store.root / m.id / src.name) and os.path.isabs(on_disk["path"])
    assert src.exists()  # copy is the default
    assert [x.id for x in store.list()] == [m.id] and store.get(m.id) == m


def test_quantization_falls_back_to_the_dominant_tensor_type(store, tmp_path):
    m = store.import_path(write_tiny_gguf(tmp_path / "a.gguf", file_type=None))
    assert m.quantization == "F32"


def test_verify_detects_a_changed_byte(store, tmp_path):
    m = store.import_path(write_tiny_gguf(tmp_path / "a.gguf"))
    assert store.verify(m.id) is True
    with open(m.path, "r+b") as f:
        f.seek(-10, os.SEEK_END)
        f.write(b"\xff")
    assert store.verify(m.id) is False


def test_move_and_link_modes(tmp_path):
    store = ModelStore(tmp_path / "models", import_mode="move")
    src = write_tiny_gguf(tmp_path / "moved.gguf", name="Moved")
    m = store.import_path(src)
    assert not src.exists() and os.path.exists(m.path) and store.verify(m.id)
    linked = write_tiny_gguf(tmp_path / "linked.gguf", name="Linked", seed=1)
    m2 = store.import_path(linked, mode="link")
    assert m2.path == str(linked.resolve())
    store.delete(m2.id)  # deleting a linked model leaves the user's file alone
    assert linked.exists() and store.get(m2.id) is None


def test_duplicate_import_returns_the_installed_model(store, tmp_path):
    src = write_tiny_gguf(tmp_path / "a.gguf")
    assert store.import_path(src).id == store.import_path(src).id
    assert len(store.list()) == 1


@pytest.mark.parametrize("make, problem", [
    (lambda p: p.write_bytes(b"not a gguf at all" * 100), "not a GGUF file"),
    (lambda p: p.write_bytes(write_tiny_gguf(p, pad_mb=0.1).read_bytes()[:-4096]), "truncated"),
    (lambda p: p.write_bytes(write_tiny_gguf(p).read_bytes()[:40]), "corrupt or truncated GGUF"),
])
def test_broken_file_is_refused_and_nothing_registered(store, tmp_path, make, problem):
    bad = tmp_path / "bad.gguf"
    make(bad)
    with pytest.raises(ModelFileError, match=problem):
        store.import_path(bad)
    assert store.list() == []
    assert not store.root.exists() or not any(store.root.iterdir())


def test_gptq_and_awq_directories_are_read_then_installed(store, tmp_path):
    """The layout is read from the files themselves (config and safetensors headers); the copy
    is the whole directory, and the user's folder is left alone."""
    g = read_meta(write_gptq_dir(tmp_path / "g", method="gptq"))
    assert (g.format, g.architecture, g.quantization) == ("gptq", "qwen2", "GPTQ-INT4-G32")
    assert g.parameter_count == gptq_dir_params()
    assert g.context_length == 4096 and (g.num_layers, g.num_kv_heads, g.head_dim) == (1, 2, 16)
    a = read_meta(write_gptq_dir(tmp_path / "a", method="awq"))
    assert a.format == "awq" and a.quantization == "AWQ-INT4-G32"
    for src, model_id in ((tmp_path / "g", "tiny-gptq"), (tmp_path / "a", "tiny-awq")):
        m = store.import_path(src, model_id=model_id)
        assert Path(m.path).is_dir() and (Path(m.path) / "model.safetensors").is_file()
        assert (src / "config.json").exists()
    assert sorted(m.id for m in store.list()) == ["tiny-awq", "tiny-gptq"]


def test_unsupported_checkpoints_are_refused_before_any_copy(store, tmp_path):
    """3-bit GPTQ (the kernels take 4 and 8), AWQ's GEMV layout and an unknown architecture are
    refused by reading the config, naming the directory; nothing is copied."""
    bad = {"3bit": ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "qwen2", "take 4 and 8"),
           "gemv": ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "qwen2", "GEMM"),
           "arch": ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "gpt_neox", "model_type")}
    for name, (qcfg, arch, problem) in bad.items():
        d = write_gptq_dir(tmp_path / name)
        cfg = json.loads((d / "config.json").read_text())
        cfg["quantization_config"], cfg["model_type"] = qcfg, arch
        (d / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ModelFileError, match=problem) as e:
            store.import_path(d, model_id=f"bad-{name}")
        assert str(d) in str(e.value)
    assert store.list() == [] and (not store.root.exists() or not any(store.root.iterdir()))


def test_directory_without_quantization_config_is_refused(store, tmp_path):
    d = write_gptq_dir(tmp_path / "d")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["quantization_config"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFileError, match="quantization_config"):
        store.import_path(d)
    assert store.list() == []


def test_truncated_safetensors_is_refused(store, tmp_path):
    d = write_gptq_dir(tmp_path / "d")
    st = d / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-100])
    with pytest.raises(ModelFileError, match="truncated"):
        store.import_path(d)


def test_bad_ids_and_missing_models(store, tmp_path):
    with pytest.raises(ValueError, match="invalid model id"):
        store.import_path(write_tiny_gguf(tmp_path / "a.gguf"), model_id="../escape")
    assert store.get("../escape") is None and store.get("nope") is None
    with pytest.raises(KeyError):
        store.delete("nope")
    with pytest.raises(KeyError):
        store.verify("nope")


def test_delete_removes_copied_files(store, tmp_path):
    m = store.import_path(write_tiny_gguf(tmp_path / "a.gguf"))
    store.delete(m.id)
    assert not (store.root / m.id).exists() and store.list() == []


def test_bundled_default_registered_in_place(store):
    bundled_model_or_skip()
    from engine.model_files.bundled import DEFAULT_MODEL_SHA256, default_model_path

    m = store.ensure_default()
    assert m.id == DEFAULT_MODEL_ID and m.source == "bundled"
    assert m.path == str(default_model_path().resolve())  # the engine's lookup agrees; site-packages, no copy
    assert not any(p.suffix == ".gguf" for p in store.root.rglob("*"))
    assert m.sha256 == DEFAULT_MODEL_SHA256
    assert (m.architecture, m.quantization) == ("llama", "Q4_1")
    assert (m.num_layers, m.num_kv_heads, m.head_dim) == (30, 3, 64)
    assert store.ensure_default() == m  # second run: nothing to do
    store.delete(DEFAULT_MODEL_ID)
    assert default_model_path().exists()  # never deletes the bundled file
    assert store.ensure_default() is None  # the user removed it: stays removed


def test_the_engines_read_only_view_reads_what_the_store_writes(store, tmp_path):
    """The engine reads `<root>/<id>/manifest.json` without importing app: same layout, same answers."""
    engine_view = pytest.importorskip("engine.server.model_store")
    g = store.import_path(write_tiny_gguf(tmp_path / "a.gguf", name="Shared"))
    q = store.import_path(write_tiny_gguf(tmp_path / "q.gguf", name="Other", seed=1), model_id="shared-q")
    view = engine_view.ModelStore(store.root)
    specs = {s.id: s for s in view.list()}
    assert specs.keys() == {g.id, "shared-q"}
    assert (specs[g.id].path, specs[g.id].format, specs[g.id].context_length) == (g.path, "gguf", 512)
    assert (view.get("shared-q").path, view.get("shared-q").format) == (q.path, "gguf")


def test_the_engine_reads_a_checkpoint_directory_on_the_command_line(tmp_path):
    """`--model DIR` reads the directory's config (no guessing from a suffix), as the store does."""
    engine_view = pytest.importorskip("engine.server.model_store")
    assert engine_view.spec_from_path(write_gptq_dir(tmp_path / "q", method="awq")).format == "awq"
    d = write_gptq_dir(tmp_path / "v")
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["checkpoint_format"] = "marlin"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFileError, match="marlin"):
        engine_view.spec_from_path(d)
    spec = engine_view.spec_from_path(write_tiny_gguf(tmp_path / "Tiny.Model.bin"))  # any suffix: the load reads it
    assert (spec.id, spec.format) == ("tiny.model", "gguf")


def test_a_models_load_settings_sit_beside_its_manifest_and_the_engine_reads_them(store, tmp_path):
    from app.store import LoadSettings
    from engine.server.model_store import ModelStore as EngineStore

    m = store.import_path(write_tiny_gguf(tmp_path / "t.gguf", name="T"))
    assert store.load_settings(m.id) == LoadSettings() and EngineStore(store.root).get(m.id).load == LoadSettings()
    mine = LoadSettings(context_length=256, device="cpu", threads=2)
    store.set_load_settings(m.id, mine)
    assert json.loads((store.root / m.id / "load_settings.json").read_text()) == {
        "context_length": 256, "device": "cpu", "threads": 2}
    assert store.load_settings(m.id) == mine and EngineStore(store.root).get(m.id).load == mine
    store.set_load_settings(m.id, LoadSettings())  # back to the app's settings: no file
    assert not (store.root / m.id / "load_settings.json").exists()
    (store.root / m.id / "load_settings.json").write_text('{"device": "tpu", "threads": 0}')
    assert EngineStore(store.root).get(m.id).load == LoadSettings()  # a damaged file never stops a load
    with pytest.raises(KeyError):
        store.set_load_settings("not-installed", mine)
    for bad in ({"context_length": 8}, {"device": "gpu"}, {"threads": 0}, {"threads": "4"}):
        with pytest.raises(ValueError):
            LoadSettings(**bad)


def test_the_engines_loader_applies_a_models_load_settings(tiny_model_factory):
    from app.store import LoadSettings
    from engine.service.loading import make_engine_factory
    from engine.service.served_model import ModelSpec

    path = tiny_model_factory(ctx=512)
    factory = make_engine_factory("torch", "auto", max_model_len=384, num_kv_blocks=64)
    spec = ModelSpec(id="t", path=str(path))
    loaded = factory(spec)  # the server's own settings when the model has none
    assert loaded.engine.max_model_len == 384
    loaded.engine.close()
    loaded = factory(ModelSpec(id="t", path=str(path), load=LoadSettings(context_length=128, device="cpu")))
    assert (loaded.engine.max_model_len, loaded.device) == (128, "cpu")  # the model's own win
    loaded.engine.close()


def test_ember_chat_loads_an_installed_model_with_its_settings(store, tmp_path, monkeypatch):
    from app.cli_chat import installed_load_settings
    from app.store import LoadSettings

    m = store.import_path(write_tiny_gguf(tmp_path / "t.gguf", name="T"))
    store.set_load_settings(m.id, LoadSettings(context_length=256, threads=2))
    monkeypatch.setenv("EMBER_MODELS_DIR", str(store.root))
    assert installed_load_settings(m.id) == LoadSettings(context_length=256, threads=2)
    assert installed_load_settings(store.get(m.id).path) == LoadSettings()  # a path names no installed model
