"""The store's file work: hashing a model's bytes and placing a file into the store so that a crash
never leaves half of one under its final name."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from engine.model_files.manifest import fsync_dir


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_path(path: Path) -> str:
    """sha256 of a file, or of a directory as the sorted lines `relpath\\0sha256(file)\\n`."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for p in sorted(q for q in path.rglob("*") if q.is_file()):
        h.update(f"{p.relative_to(path).as_posix()}\0{sha256_file(p)}\n".encode())
    return h.hexdigest()


def path_size(path: Path) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def place(src: Path, dest: Path, *, move: bool) -> None:
    """Copy (or move) into the store through a `.part` name, fsynced, then renamed atomically."""
    part = dest.with_name(dest.name + ".part")
    if move:
        try:
            os.replace(src, dest)  # same filesystem: atomic, no copy
            return
        except OSError:
            pass  # another filesystem: copy then delete the source
    if part.exists():
        shutil.rmtree(part) if part.is_dir() else part.unlink()
    if src.is_dir():
        shutil.copytree(src, part)
        for p in part.rglob("*"):
            if p.is_file():
                with open(p, "rb+") as f:
                    os.fsync(f.fileno())
    else:
        shutil.copyfile(src, part)
        with open(part, "rb+") as f:
            os.fsync(f.fileno())
    os.replace(part, dest)
    fsync_dir(dest.parent)
    if move:
        shutil.rmtree(src) if src.is_dir() else src.unlink()



def place_checked(src: Path, dest: Path, digest: str, *, move: bool) -> Path:
    """`place`, then `dest` hashed again: a copy that differs from `digest` raises ModelFileError."""
    from engine.model_files.errors import ModelFileError

    place(src, dest, move=move)
    if sha256_path(dest) != digest:
        raise ModelFileError(f"{dest}: copy differs from {src} (disk error?)")
    return dest
