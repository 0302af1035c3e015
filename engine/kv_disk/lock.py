"""One engine per model folder of the disk tier: an flock on `lock` inside it, held while the
engine runs and released with its descriptor (also when the process dies)."""
from __future__ import annotations

import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; the tier stays off there
    fcntl = None

LOCK_NAME, LABEL_NAME = "lock", "model.txt"  # the lock; the model file the blocks were written for


class FolderBusy(RuntimeError):
    """Another engine holds this model's folder (or this system has no file locks)."""


def lock_folder(folder: Path, create: bool = True) -> int:
    """An open descriptor holding the folder's lock; FolderBusy when another holds it. Without
    `create` a folder with no lock file raises FileNotFoundError (a probe must not put one back
    into a folder that is being deleted)."""
    if fcntl is None:
        raise FolderBusy("this system has no file locks")
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise FolderBusy(f"{folder} is in use by another engine") from None
    return fd
