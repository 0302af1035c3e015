"""The disk tier's folder without a model: LRU eviction within the budget across restarts, one
engine per folder, a write that fails (a full disk) logged and survived."""
from __future__ import annotations

import logging
import time

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
    assert store.put(1, _block(1))
    while store.num_written < 1:  # the writer swept the root at its start and wrote: the folder is ours now
        time.sleep(0.01)
    store.folder.rename(tmp_path.parent / f"{tmp_path.name}-gone")
    store.folder.write_text("")  # every write now fails, as on a full disk
    with caplog.at_level(logging.WARNING, logger="engine.kv_disk"):
        assert store.put(2, _block(2))
        store.close()
    assert store.num_written == 1 and not store.contains(2)
    assert "not written" in caplog.text
    assert not (tmp_path / file_name(2)).exists()


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


WRITER = """
import sys
from engine.kv_disk.store import KVDiskStore
store = KVDiskStore(sys.argv[1], b"0123456789abcdef", 2**30)
print("writing", flush=True)
for h in range(1, 10**6):
    while not store.put(h, bytes([h % 251]) * 200_000):
        pass
"""


def test_a_kill_during_writes_leaves_only_whole_files(tmp_path):
    """kill -9 while the writer writes: what a new store finds is whole or absent, never half."""
    import os
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.stdout.readline() == "writing\n"
    while len(list(tmp_path.glob("*/*.kv"))) < 3 and proc.poll() is None:  # some written, more on the way
        pass
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = KVDiskStore(tmp_path, SALT, budget_bytes=2**30)
    assert not list(store.folder.glob("*.tmp"))  # a write cut short was swept
    assert store.num_blocks >= 3
    for h in [int(p.stem, 16) for p in store.folder.glob("*.kv")]:
        assert store.get(h) == bytearray([h % 251]) * 200_000
    assert store.num_refused == 0
    store.close()
