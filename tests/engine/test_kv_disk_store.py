"""The disk tier's folder without a model: LRU eviction within the budget across restarts, one
engine per folder, a write that fails (a full disk) logged and survived."""
from __future__ import annotations

import logging
import shutil

import pytest

from engine.config import EngineConfig
from engine.kv_disk.block_file import HEADER, file_name
from engine.kv_disk.lock import FolderBusy
from engine.kv_disk.store import KVDiskStore
from engine.kv_disk.tier import open_disk_tier
from engine.runner import Runner

SALT = b"0123456789abcdef"
PAYLOAD = 1000
FILE = HEADER.size + PAYLOAD


def _block(i: int) -> bytes:
    return bytes([i]) * PAYLOAD


def _store(root, files: float = 100) -> KVDiskStore:
    return KVDiskStore(root, SALT, budget_bytes=int(files * FILE), label="model.gguf")


def test_the_budget_evicts_the_least_recently_used_across_restarts(tmp_path):
    store = _store(tmp_path, files=3.5)
    for h in (1, 2, 3):
        assert store.put(h, _block(h))
    store.close()
    store = _store(tmp_path, files=3.5)  # a restart: what is on disk is known again
    assert all(store.contains(h) for h in (1, 2, 3))
    assert store.get(1) == bytearray(_block(1))  # used: now the most recent
    store.put(4, _block(4))
    store.close()
    store = _store(tmp_path, files=3.5)
    assert [h for h in (1, 2, 3, 4) if store.contains(h)] == [1, 3, 4]  # 2 was the least recently used
    assert store.get(2) is None and store.get(4) == bytearray(_block(4))
    store.close()


def test_a_block_is_written_once(tmp_path):
    store = _store(tmp_path)
    assert store.put(7, _block(7))
    store.close()
    store = _store(tmp_path)
    assert not store.wants(7) and not store.put(7, _block(7))
    store.close()


def test_one_engine_per_folder(tmp_path, caplog):
    store = _store(tmp_path)
    with pytest.raises(FolderBusy):
        _store(tmp_path)
    store.close()
    _store(tmp_path).close()  # free again once the first closed


class _DiskRunner(Runner):
    def __init__(self, kv_identity: str | None = "a model") -> None:
        self.kv_identity = kv_identity


def test_a_busy_folder_leaves_the_tier_off(tmp_path, caplog):
    config = EngineConfig(model_path="m.gguf", kv_disk_dir=str(tmp_path))
    tier = open_disk_tier(config, _DiskRunner())
    assert tier is not None
    with caplog.at_level(logging.WARNING, logger="engine.kv_disk"):
        assert open_disk_tier(config, _DiskRunner()) is None
    assert "in use by another engine" in caplog.text
    assert open_disk_tier(config, _DiskRunner(None)) is None  # a runner whose KV cannot go to disk
    tier.close()


def test_a_failed_write_is_logged_and_survived(tmp_path, caplog):
    store = _store(tmp_path)
    shutil.rmtree(store.folder)
    store.folder.write_text("")  # every write now fails, as on a full disk
    with caplog.at_level(logging.WARNING, logger="engine.kv_disk"):
        assert store.put(1, _block(1))
        store.close()
    assert store.num_written == 0 and not store.contains(1)
    assert "not written" in caplog.text
    assert not (tmp_path / file_name(1)).exists()


def test_a_removed_models_blocks_go_when_an_engine_opens_the_tier(tmp_path):
    model = tmp_path / "gone.gguf"
    model.write_bytes(b"GGUF")
    gone = KVDiskStore(tmp_path / "cache", b"gone-model-salt!", 2**30, label=str(model))
    gone.put(1, _block(1))
    gone.close()
    model.unlink()  # the model was removed
    other = KVDiskStore(tmp_path / "cache", SALT, 2**30, label=str(tmp_path))
    other.close()  # its writer swept first
    assert not gone.folder.exists() and other.folder.exists()
