"""The disk tier's folder: one file per KV block, a writer thread, a byte budget, a lock.

`root/<salt hex>/` holds one model's blocks (block_file.py), named by their chain hash, and is
locked (flock) by the engine that uses it: a second engine on the same model and folder runs
without the tier (`FolderBusy`) instead of racing the first. The engine thread only copies a
block and queues it (`put`); the writer thread writes it, and past `MAX_PENDING_BYTES` waiting a
new block is dropped rather than waited for. A file's mtime is its last use (set on write and on
every read), so eviction is LRU across restarts: when the root's files pass the budget (never
more than `FREE_SHARE` of the disk's free space), the writer deletes the least recently used,
of any model, down to `LOW_WATER` of it. A reader that finds its file gone (evicted) or bad
(refused, deleted) computes the prefix again.
"""
from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
import time
from pathlib import Path

from engine.kv_disk.block_file import SUFFIX, BadBlockFile, file_name, read_block_file, write_block_file
from engine.kv_disk.folders import clear
from engine.kv_disk.lock import LABEL_NAME, lock_folder

log = logging.getLogger(__name__)

FREE_SHARE = 0.25  # of the free space (the tier's own files counted as free)
LOW_WATER = 0.9  # eviction goes down to this share of the budget, so it does not run after every write
MAX_PENDING_BYTES = 256 * 2**20  # copies waiting for the writer; past it a new block is not kept


def effective_budget(root: Path, budget_bytes: int, used: int) -> int:
    """The budget, never past FREE_SHARE of what the disk has free plus what the tier holds."""
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return budget_bytes
    return min(budget_bytes, int(FREE_SHARE * (free + used)))


def scan(root: Path) -> list[tuple[int, str, int, Path]]:
    """(mtime_ns, name, size, path) of every block file under root, any model's."""
    out = []
    for sub in (os.scandir(root) if root.is_dir() else ()):
        if not sub.is_dir(follow_symlinks=False):
            continue
        for entry in os.scandir(sub.path):
            if entry.name.endswith(SUFFIX):
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                out.append((st.st_mtime_ns, entry.name, st.st_size, Path(entry.path)))
    return out


class KVDiskStore:
    """One model's blocks under root; `put` from the engine thread, `get` on a prefix miss."""

    def __init__(self, root: str | Path, salt: bytes, budget_bytes: int, label: str = "") -> None:
        self.root, self.salt, self.budget_bytes = Path(root), salt, budget_bytes
        self.folder = self.root / salt.hex()
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.folder.mkdir(mode=0o700, exist_ok=True)
        self._lock_fd = lock_folder(self.folder)
        fd = os.open(self.folder / LABEL_NAME, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(label)  # which model: `ember cache info` and removing a model read it
        self._hashes: set[int] = set()
        for entry in os.scandir(self.folder):
            if entry.name.endswith(".tmp"):  # a write a killed engine left behind
                Path(entry.path).unlink(missing_ok=True)
            elif entry.name.endswith(SUFFIX):
                try:
                    self._hashes.add(int(entry.name[:-len(SUFFIX)], 16))
                except ValueError:
                    continue
        self._mutex = threading.Lock()
        self._queued: set[int] = set()
        self._pending_bytes, self._last_stamp, self._closed = 0, 0, False
        self._used = sum(size for _, _, size, _ in scan(self.root))
        self.num_written = self.num_read = self.num_refused = self.num_dropped = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write_loop, name="kv-disk-writer", daemon=True)
        self._writer.start()

    @property
    def num_blocks(self) -> int:
        return len(self._hashes)

    def contains(self, block_hash: int) -> bool:
        """Whether a file for this block was written (it may still be evicted before a read)."""
        return block_hash in self._hashes

    def wants(self, block_hash: int) -> bool:
        """Whether `put` would keep this block: not on disk, not queued, and room in the queue."""
        return not (block_hash in self._hashes or block_hash in self._queued or self._closed
                    or self._pending_bytes >= MAX_PENDING_BYTES)

    def has(self, block_hash: int) -> bool:
        """Whether the block is on disk or queued for it."""
        return block_hash in self._hashes or block_hash in self._queued

    def put(self, block_hash: int, payload, replace: bool = False) -> bool:
        """Queue a copy of a block (a bytes-like object the caller no longer writes) for the
        writer; never waits. False: not kept (already there, or the queue is full). `replace`: a
        new version of a block that is there (a thinner one, tier.py), written over its file."""
        nbytes = memoryview(payload).nbytes
        with self._mutex:
            if self._closed or self.has(block_hash) != replace:
                return False
            if self._pending_bytes + nbytes > MAX_PENDING_BYTES:
                self.num_dropped += 1
                return False
            if not replace:
                self._queued.add(block_hash)
            self._pending_bytes += nbytes
        self._queue.put((block_hash, payload, nbytes))
        return True

    def get(self, block_hash: int) -> bytearray | None:
        """The block's checked bytes, or None: absent, evicted, or bad (then deleted and logged)."""
        path = self.folder / file_name(block_hash)
        try:
            payload = read_block_file(path, self.salt, block_hash)
        except FileNotFoundError:
            self._forget(block_hash)
            return None
        except (BadBlockFile, OSError) as e:
            log.warning("KV disk tier: %s; deleted, its prefix is computed again", e)
            self.discard(block_hash)
            self.num_refused += 1
            return None
        self._stamp(path)
        self.num_read += 1
        return payload

    def discard(self, block_hash: int) -> None:
        """Delete a block's file (one that must not be served)."""
        self._forget(block_hash)
        try:
            (self.folder / file_name(block_hash)).unlink(missing_ok=True)
        except OSError as e:
            log.warning("KV disk tier: could not delete a bad block file: %s", e)

    def close(self) -> None:
        """Write what is queued, stop the writer and give the folder's lock back (idempotent)."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
        self._queue.put(None)
        self._writer.join()
        os.close(self._lock_fd)

    def _forget(self, block_hash: int) -> None:
        with self._mutex:
            self._hashes.discard(block_hash)

    def _stamp(self, path: Path) -> None:
        """Mark a file used now (its mtime, strictly after the last one this store set)."""
        with self._mutex:
            t = self._last_stamp = max(time.time_ns(), self._last_stamp + 1000)
        try:
            os.utime(path, ns=(t, t))
        except OSError:
            pass

    def _write_loop(self) -> None:
        try:
            clear(self.root, only_orphans=True)  # the blocks of models removed since
        except OSError as e:
            log.warning("KV disk tier: could not sweep the blocks of removed models: %s", e)
        self._evict_if_over()
        while (item := self._queue.get()) is not None:
            block_hash, payload, nbytes = item
            path = self.folder / file_name(block_hash)
            try:
                old = path.stat().st_size if block_hash in self._hashes else 0  # a block written over
            except OSError:
                old = 0
            try:
                size = write_block_file(path, self.salt, block_hash, payload)
            except OSError as e:
                log.warning("KV disk tier: a block was not written (%s); the chat goes on without it", e)
                size = 0
            with self._mutex:
                self._queued.discard(block_hash)
                self._pending_bytes -= nbytes
                if size:
                    self._hashes.add(block_hash)
                    self._used += size - old
                    self.num_written += 1
            if size:
                self._stamp(path)
                self._evict_if_over()

    def _evict_if_over(self) -> None:
        """Delete the least recently used files under root (any model's) past the budget."""
        if self._used <= effective_budget(self.root, self.budget_bytes, self._used):
            return
        files = scan(self.root)
        used = sum(size for _, _, size, _ in files)
        target = LOW_WATER * effective_budget(self.root, self.budget_bytes, used)
        for _, name, size, path in sorted(files):
            if used <= target:
                break
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError:
                continue
            used -= size
            if path.parent == self.folder:
                self._forget(int(name[:-len(SUFFIX)], 16))
        self._used = used
