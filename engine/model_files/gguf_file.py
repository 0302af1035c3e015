"""The one GGUF container reader (app, ui and engine): metadata and tensor directory over an mmap.

Why not gguf-py's GGUFReader: it builds numpy views for every element of every array up front,
so a 49k-token vocabulary with 49k merges costs seconds before a single weight is read, and it
fails on damaged files with errors that do not say what is wrong. Here every length and offset
is checked against the file size before it is used (nothing is allocated from a size the file
claims), and large arrays (token lists, merges) stay unread until someone asks for them, so
listing or importing a model reads a dozen keys in milliseconds. numpy and gguf-py's constants
only: no torch. Tests compare it with GGUFReader (tests/engine/test_gguf_header.py).

Layout (GGUF v2/v3, little-endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv;
n_kv x (string key, u32 type, value); n_tensors x (string name, u32 n_dims, u64 dims[n_dims]
innermost first, u32 ggml type, u64 offset); padding to `general.alignment` (default 32);
tensor data. A string is u64 length + UTF-8 bytes; an array is u32 item type, u64 count, items.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
GGUF_MAGIC = b"GGUF"
EAGER_ARRAY_MAX = 1024  # arrays up to this many items are decoded at once; longer ones on demand


class GGUFFormatError(ValueError):
    """The bytes are not a well-formed GGUF container (wrong magic, truncated, corrupt)."""


@dataclass(frozen=True, slots=True)
class LazyArray:
    item_type: int
    count: int
    offset: int  # of the first item


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order: (out, in) for a matrix (GGUF's dims reversed)
    qtype: int  # ggml type id (may be one we cannot dequantize; the loader decides)
    offset: int  # absolute byte offset in the file
    nbytes: int | None  # None when the type is unknown to gguf-py

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.qtype).name
        except ValueError:
            return f"unknown type {self.qtype}"


class _Cursor:
    def __init__(self, buf: mmap.mmap, size: int, pos: int = 0) -> None:
        self.buf, self.size, self.pos = buf, size, pos

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFFormatError(f"truncated: {what} at byte {self.pos} needs {n} bytes, "
                                  f"the file has {self.size}")

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return value

    def string(self, what: str) -> str:
        n = self.unpack("<Q", what)
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            item_type, count = self.unpack("<I", what), self.unpack("<Q", what)
            start = self.pos
            if item_type in _SCALARS:  # fixed size: skip (bounds-checked) or decode
                self.need(count * struct.calcsize(_SCALARS[item_type]), what)
                self.pos += count * struct.calcsize(_SCALARS[item_type])
            elif item_type == _STRING:
                self.need(count * 8, what)  # each string is at least its u64 length
                for _ in range(count):
                    n = self.unpack("<Q", what)
                    self.need(n, what)
                    self.pos += n
            else:
                raise GGUFFormatError(f"corrupt: {what} is an array of type {item_type}")
            arr = LazyArray(item_type, count, start)
            return decode_array(self.buf, self.size, arr) if count <= EAGER_ARRAY_MAX else arr
        raise GGUFFormatError(f"corrupt: {what} has unknown value type {vtype}")


def decode_array(buf: mmap.mmap, size: int, arr: LazyArray) -> list:
    cur = _Cursor(buf, size, arr.offset)
    return [cur.value(arr.item_type, "array item") for _ in range(arr.count)]


class GGUFFile:
    """`metadata` (str -> value; long arrays as LazyArray, see `get`), `tensors` (name -> TensorInfo)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            magic = f.read(4)
            if magic != GGUF_MAGIC:
                raise GGUFFormatError(f"not a GGUF file (magic {magic!r}, expected b'GGUF')")
            self.size = f.seek(0, 2)
            self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        cur = _Cursor(self._buf, self.size, 4)
        self.version = cur.unpack("<I", "version")
        if self.version not in (2, 3):
            raise GGUFFormatError(f"unsupported GGUF version {self.version} (supported: 2, 3)")
        n_tensors, n_kv = cur.unpack("<Q", "tensor count"), cur.unpack("<Q", "metadata count")
        # Each metadata entry takes >= 12 bytes and each tensor entry >= 24: refuse absurd counts.
        if 24 + 12 * n_kv + 24 * n_tensors > self.size:
            raise GGUFFormatError(f"implausible counts: the header claims {n_kv} metadata entries and "
                                  f"{n_tensors} tensors, more than a {self.size}-byte file holds")
        self.metadata: dict[str, Any] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}")
            self.metadata[key] = cur.value(cur.unpack("<I", key), f"metadata {key!r}")
        infos = []
        for i in range(n_tensors):
            name = cur.string(f"tensor name #{i}")
            n_dims = cur.unpack("<I", name)
            if not 1 <= n_dims <= 4:
                raise GGUFFormatError(f"corrupt: tensor {name} has {n_dims} dimensions")
            dims = [cur.unpack("<Q", name) for _ in range(n_dims)]
            infos.append((name, tuple(reversed(dims)), cur.unpack("<I", name), cur.unpack("<Q", name)))
        align = self.metadata.get("general.alignment", 32)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise GGUFFormatError(f"corrupt: general.alignment = {align!r}")
        self.data_offset = -(-cur.pos // align) * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, qtype, rel in infos:
            self.tensors[name] = TensorInfo(name, shape, qtype, self.data_offset + rel, _nbytes(qtype, shape))

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Unmap now (a header read for the store), not when the object is collected."""
        self._buf.close()

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value, decoding a long array on first use."""
        value = self.metadata.get(key, default)
        if isinstance(value, LazyArray):
            value = self.metadata[key] = decode_array(self._buf, self.size, value)
        return value

    def raw(self, t: TensorInfo) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the map (checked to lie inside the file)."""
        if t.nbytes is None or t.offset + t.nbytes > self.size:
            raise GGUFFormatError(f"truncated: tensor {t.name} runs past the end of the {self.size}-byte file")
        return np.frombuffer(self._buf, dtype=np.uint8, count=t.nbytes, offset=t.offset)


def _nbytes(qtype: int, shape: tuple[int, ...]) -> int | None:
    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        return None
    n = 1
    for d in shape:
        n *= d
    return None if n % block else n // block * size
