"""What makes a KV block reusable by another process: the salt of its disk key.

Two engines may share a block only when they would have computed the same bytes: the same
model file, the same KV type, weights kept the same way, the same kernels (ABI and CPU path),
torch, device, the family's RoPE facts and shapes (the ModelConfig, the context its RoPE serves),
and the block size. The runner says its facts (`Runner.kv_identity`); `salt` hashes them with the
block size. A model file is known by its size, mtime and a hash of three 1 MiB samples: cheap on
a 10 GB file, and a file replaced or edited in place gets another identity.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

SAMPLE = 2**20
FORMAT = 1  # of the block files' payload layout (engine/kv_pool.py's read_blocks); bump on change


def _file_identity(path: Path, h) -> None:
    st = path.stat()
    h.update(f"{path.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    with open(path, "rb") as f:
        for offset in (0, max(0, st.st_size // 2 - SAMPLE // 2), max(0, st.st_size - SAMPLE)):
            f.seek(offset)
            h.update(f.read(SAMPLE))


def model_identity(model_path: str | os.PathLike) -> str:
    """A cheap stable identity of a model file, or of a checkpoint folder's files."""
    path = Path(model_path)
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for p in files:
        _file_identity(p, h)
    return h.hexdigest()


def salt(kv_identity: str, block_size: int) -> bytes:
    """The 16 bytes every block file of this model, configuration and build carries."""
    text = f"ember-kv-disk {FORMAT}\0{kv_identity}\0block {block_size}"
    return hashlib.blake2b(text.encode(), digest_size=16).digest()
