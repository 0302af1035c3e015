"""The block manager's view of the disk tier: offer newly hashed blocks, bring a prefix back.

The runner copies a block's K and V of every layer (`read_blocks`, one copy, on the engine
thread) and the store's writer writes them; on a prefix hit that RAM misses, the store reads and
checks a file and the runner writes it into a free block of its pool (`write_block`). A payload
of the wrong size is refused like a bad file. A block its sequence's sliding window has left
(engine/kv_window.py) is written again with only the layers that have no window (Gemma 3's global
layers: 1 in 6), as the pool keeps it; read back, it is such a block again, and a prefix hit
whose window needs it stops before it. `open_disk_tier` returns None where the tier cannot be: no
folder set, a runner whose KV cannot go to disk, or the folder held by another engine.
"""
from __future__ import annotations

import logging
from pathlib import Path

from engine.config import EngineConfig
from engine.kv_disk.identity import salt
from engine.kv_disk.lock import FolderBusy
from engine.kv_disk.store import KVDiskStore
from engine.runner import Runner

log = logging.getLogger(__name__)


class DiskTier:
    def __init__(self, store: KVDiskStore, runner: Runner) -> None:
        self.store, self.runner = store, runner

    def offer(self, blocks: list[tuple[int, int]]) -> None:
        """(block id, chain hash) of blocks just full and computed: queue copies of the new ones."""
        new = [(b, h) for b, h in blocks if self.store.wants(h)]
        if new:
            for (_, h), payload in zip(new, self.runner.read_blocks([b for b, _ in new])):
                self.store.put(h, payload)

    def thin(self, blocks: list[tuple[int, int]]) -> None:
        """(block id, chain hash) of blocks out of the sliding window: their files keep only the
        layers without a window from now on."""
        kept = [(b, h) for b, h in blocks if self.store.has(h)]
        if kept:
            for (_, h), payload in zip(kept, self.runner.read_blocks([b for b, _ in kept], window_layers=False)):
                self.store.put(h, payload, replace=True)

    def contains(self, block_hash: int) -> bool:
        return self.store.contains(block_hash)

    def fetch(self, block_hash: int, block_id: int) -> bool | None:
        """Read the block's file into pool block `block_id`: True, or False for a block out of the
        window (only the layers without one); None (nothing written) if it cannot be."""
        payload = self.store.get(block_hash)
        if payload is None:
            return None
        try:
            return self.runner.write_block(block_id, payload)
        except ValueError as e:
            log.warning("KV disk tier: %s; the file is deleted", e)
            self.store.discard(block_hash)
            return None

    def close(self) -> None:
        self.store.close()


def open_disk_tier(config: EngineConfig, runner: Runner) -> DiskTier | None:
    if not config.kv_disk_dir or runner.kv_identity is None or not config.enable_prefix_caching:
        return None
    try:
        store = KVDiskStore(Path(config.kv_disk_dir), salt(runner.kv_identity, config.block_size),
                            int(config.kv_disk_budget_gib * 2**30), label=str(Path(config.model_path).resolve()))
    except FolderBusy as e:
        log.warning("KV disk tier off for %s: %s", config.model_path, e)
        return None
    except OSError as e:
        log.warning("KV disk tier off: its folder %s cannot be used (%s)", config.kv_disk_dir, e)
        return None
    log.info("KV disk tier: %s (%d blocks kept, budget %.1f GiB)", store.folder, store.num_blocks,
             config.kv_disk_budget_gib)
    return DiskTier(store, runner)
