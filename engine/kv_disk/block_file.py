"""One KV block on disk: a header that says what it is, then the block's bytes.

The header holds a magic, the salt (which model, KV type, kernels, ...: identity.py), the block's
chain hash, the payload's length and its CRC-32. A file is served only when all of them match
what the reader expects and the file is exactly that long: a short, flipped or foreign file is
refused (`BadBlockFile`), never read into the pool. Files are written to a temporary name and
renamed, so a reader never sees half a file.
"""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

MAGIC = b"EMBERKV1"
HEADER = struct.Struct("<8s16s16sQI")  # magic, salt, block hash, payload bytes, CRC-32 of the payload
SUFFIX = ".kv"


class BadBlockFile(ValueError):
    """A block file that must not be served; the message says why."""


def file_name(block_hash: int) -> str:
    return f"{block_hash:032x}{SUFFIX}"


def write_block_file(path: Path, salt: bytes, block_hash: int, payload) -> int:
    """Write payload (a bytes-like object) under path, atomically (temporary file, then rename),
    readable by the user only. Returns the file's size; an OSError leaves no file behind."""
    view = memoryview(payload).cast("B")
    header = HEADER.pack(MAGIC, salt, block_hash.to_bytes(16, "little"), view.nbytes, zlib.crc32(view))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            f.write(view)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return HEADER.size + view.nbytes


def read_block_file(path: Path, salt: bytes, block_hash: int) -> bytearray:
    """The payload of path, checked against the salt, the hash, its length and its CRC-32.
    FileNotFoundError when it is gone (evicted meanwhile); BadBlockFile when it must not be served."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(HEADER.size)
        if len(head) < HEADER.size:
            raise BadBlockFile(f"{path.name}: cut short ({size} bytes)")
        magic, file_salt, file_hash, length, crc = HEADER.unpack(head)
        if magic != MAGIC:
            raise BadBlockFile(f"{path.name}: not a KV block file")
        if file_salt != salt or file_hash != block_hash.to_bytes(16, "little"):
            raise BadBlockFile(f"{path.name}: from another model, KV type or kernel build")
        if size != HEADER.size + length:
            raise BadBlockFile(f"{path.name}: {size} bytes, its header says {HEADER.size + length}")
        payload = bytearray(length)
        if f.readinto(payload) != length:
            raise BadBlockFile(f"{path.name}: cut short while reading")
    if zlib.crc32(payload) != crc:
        raise BadBlockFile(f"{path.name}: checksum mismatch")
    return payload
