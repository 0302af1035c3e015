"""The disk tier's root as a whole: what it holds per model (`ember cache info`), and clearing it
(`ember cache clear`; a model's blocks when it is removed, `forget_model`; those of models removed
otherwise, when an engine opens the tier). Torch-free.

A model's folder that an engine holds (its lock) keeps its folder and lock; only its block files
go, which that engine then reads as misses. A folder no engine holds goes whole.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.kv_disk.block_file import SUFFIX
from engine.kv_disk.lock import LABEL_NAME, FolderBusy, lock_folder


@dataclass(frozen=True, slots=True)
class CacheFolder:
    path: Path
    model: str  # the model file it was written for, as its engine named it
    num_blocks: int
    num_bytes: int
    in_use: bool  # an engine holds it now

    @property
    def orphaned(self) -> bool:
        """Its model file is gone (removed): nothing will read these blocks again."""
        return not self.model or not Path(self.model).exists()


def _folder(path: Path) -> CacheFolder:
    files = [e for e in os.scandir(path) if e.name.endswith(SUFFIX)]
    try:
        model = (path / LABEL_NAME).read_text(encoding="utf-8").strip()
    except OSError:
        model = ""
    try:
        os.close(lock_folder(path, create=False))
        in_use = False
    except FolderBusy:
        in_use = True
    except OSError:  # no lock file: no engine holds it (or the folder is going away)
        in_use = False
    return CacheFolder(path, model, len(files), sum(_size(e) for e in files), in_use)


def _size(entry: os.DirEntry) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_size
    except OSError:
        return 0


def cache_folders(root: str | Path) -> list[CacheFolder]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((_folder(Path(e.path)) for e in os.scandir(root) if e.is_dir(follow_symlinks=False)),
                  key=lambda f: f.model)


def forget_model(root: str | Path, model_path: str | Path) -> tuple[int, int]:
    """Delete the blocks written for this model file or folder (`ember models rm`, the window's
    Remove), whatever the configuration they were made with; call it before the file goes, so that
    a link still resolves. Returns (blocks, bytes) deleted."""
    return clear(root, model=str(Path(model_path).resolve()))


def clear(root: str | Path, only_orphans: bool = False, model: str | None = None) -> tuple[int, int]:
    """Delete the blocks under root (only_orphans: only those of removed models, never in a
    folder an engine holds; model: only those written for that resolved path); returns (blocks,
    bytes) deleted. A folder is deleted under its lock."""
    blocks = size = 0
    for folder in cache_folders(root):
        if (only_orphans and (folder.in_use or not folder.orphaned)) or (model is not None and folder.model != model):
            continue
        try:
            fd = lock_folder(folder.path)
        except FolderBusy:
            fd = None  # an engine holds it: its block files go, it reads them as misses
        except OSError:
            continue
        try:
            for entry in os.scandir(folder.path):
                if entry.name.endswith(SUFFIX) or fd is not None:
                    Path(entry.path).unlink(missing_ok=True)
            if fd is not None:
                folder.path.rmdir()
        except OSError:
            pass
        finally:
            if fd is not None:
                os.close(fd)
        blocks, size = blocks + folder.num_blocks, size + folder.num_bytes
    return blocks, size
