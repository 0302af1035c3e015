"""The disk tier as the user sees it: the setting becomes the engine's flags, `ember cache
info|clear` show and empty <data_dir>/kv-cache."""
from __future__ import annotations

import pytest

from app.cli import main
from app.engine_process import engine_args, to_argv
from app.settings import Settings
from engine.kv_disk.store import KVDiskStore


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "home"))
    return tmp_path


def test_the_setting_reaches_the_engine(home):
    s = Settings.load()
    args = engine_args(s)
    assert args["kv_disk_dir"] == str(s.data_dir / "kv-cache") and args["kv_disk_budget_gib"] == 4.0
    argv = to_argv({k: v for k, v in args.items() if k != "api_key"})
    assert argv[argv.index("--kv-disk-dir") + 1] == str(s.kv_cache_dir)
    s.kv_disk_gib = 0
    assert engine_args(s)["kv_disk_dir"] is None  # off


def test_cache_info_and_clear(home, capsys):
    model = home / "model.gguf"
    model.write_bytes(b"GGUF")
    root = Settings.load().kv_cache_dir
    store = KVDiskStore(root, b"0123456789abcdef", 2**30, label=str(model))
    for h in range(3):
        store.put(h, bytes(1000))
    store.close()
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert "3 blocks" in out.splitlines()[0] and f"{model}: 3 blocks" in out
    model.unlink()
    assert main(["cache", "info"]) == 0 and "model removed" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0 and "deleted 3 blocks" in capsys.readouterr().out
    assert main(["cache", "info"]) == 0 and "0 blocks" in capsys.readouterr().out


def test_models_rm_deletes_the_models_blocks_at_once(home, tiny_model_factory, capsys):
    model, other = tiny_model_factory(), home / "other.gguf"
    other.write_bytes(b"GGUF")
    assert main(["models", "import", str(model), "--link", "--id", "tiny"]) == 0
    root = Settings.load().kv_cache_dir
    for label, salt in ((model.resolve(), b"0123456789abcdef"), (other, b"fedcba9876543210")):
        store = KVDiskStore(root, salt, 2**30, label=str(label))
        for h in range(3):
            store.put(h, bytes(1000))
        store.close()
    assert main(["models", "rm", "tiny"]) == 0
    assert model.exists() and "left in place" in capsys.readouterr().out  # a linked file stays; its blocks do not
    assert not (root / b"0123456789abcdef".hex()).exists()
    assert len(list((root / b"fedcba9876543210".hex()).glob("*.kv"))) == 3
