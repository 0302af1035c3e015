"""A fast GGUF header reader: metadata keys and tensor infos, without loading the vocabulary.

gguf.GGUFReader builds a numpy view per vocabulary string (seconds for a 50k-token model on a
busy 2-core machine); listing or importing a model needs a dozen keys. This walks the header
once over an mmap, skipping large arrays, with every length checked against the file size so a
corrupt header raises GGUFHeaderError instead of allocating. Tests compare it with GGUFReader.

Layout (GGUF v2/v3): magic "GGUF", u32 version, u64 tensor_count, u64 kv_count, then kv_count ×
(string key, u32 type, value), then tensor_count × (string name, u32 n_dims, u64 dims[n_dims],
u32 ggml_type, u64 offset); tensor data starts at the next multiple of general.alignment (32).
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

# GGUF value types -> struct format of one scalar
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
KEEP_ARRAY_MAX = 4096  # arrays up to this long are returned (per-layer head counts); longer ones skipped


class GGUFHeaderError(ValueError):
    pass


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # absolute, in the file
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    fields: dict  # key -> value; large arrays are left out
    tensors: list[TensorInfo]
    data_offset: int
    file_size: int


class _Cursor:
    def __init__(self, buf, order: str):
        self.buf, self.pos, self.order, self.size = buf, 0, order, len(buf)

    def take(self, fmt: str):
        n = struct.calcsize(fmt)
        if self.pos + n > self.size:
            raise GGUFHeaderError(f"header runs past the end of the file at byte {self.pos}")
        (v,) = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        self.pos += n
        return v

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFHeaderError(f"length {n} at byte {self.pos} runs past the end of the file")
        self.pos += n

    def string(self) -> str:
        n = self.take("Q")
        start = self.pos
        self.skip(n)
        return bytes(self.buf[start:self.pos]).decode("utf-8", errors="replace")

    def value(self, vtype: int, keep: bool = True):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            if keep:
                return self.string()
            self.skip(self.take("Q"))
            return None
        if vtype == _ARRAY:
            itype, count = self.take("I"), self.take("Q")
            if itype in _SCALARS:
                size = struct.calcsize(_SCALARS[itype])
                if count > (self.size - self.pos) // size:
                    raise GGUFHeaderError(f"array of {count} items at byte {self.pos} is longer than the file")
                if keep and count <= KEEP_ARRAY_MAX:
                    return [self.take(_SCALARS[itype]) for _ in range(count)]
                self.skip(count * size)
                return None
            if count > self.size - self.pos:  # every item takes at least one byte
                raise GGUFHeaderError(f"array of {count} items at byte {self.pos} is longer than the file")
            if keep and itype == _STRING and count <= KEEP_ARRAY_MAX:
                return [self.string() for _ in range(count)]
            for _ in range(count):
                self.value(itype, keep=False)
            return None
        raise GGUFHeaderError(f"unknown GGUF value type {vtype} at byte {self.pos}")


def read_gguf_header(path: Path) -> GGUFHeader:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            raise GGUFHeaderError(f"{size} bytes is too short for a GGUF header")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != b"GGUF":
                raise GGUFHeaderError(f"bad magic {bytes(buf[:4])!r}")
            (version,) = struct.unpack_from("<I", buf, 4)
            order = "<"
            if version > 0xFFFF:  # a big-endian file reads as a huge little-endian number
                order, (version,) = ">", struct.unpack_from(">I", buf, 4)
            if version not in (2, 3):
                raise GGUFHeaderError(f"GGUF version {version} is not supported (2 or 3)")
            cur = _Cursor(buf, order)
            cur.pos = 8
            n_tensors, n_kv = cur.take("Q"), cur.take("Q")
            if n_tensors > size // 24 or n_kv > size // 12:
                raise GGUFHeaderError(f"implausible counts: {n_tensors} tensors, {n_kv} keys")
            fields = {}
            for _ in range(n_kv):
                key = cur.string()
                vtype = cur.take("I")
                fields[key] = cur.value(vtype, keep=not key.startswith("tokenizer.ggml."))
            infos = []
            for _ in range(n_tensors):
                name = cur.string()
                n_dims = cur.take("I")
                if n_dims > 8:
                    raise GGUFHeaderError(f"tensor {name!r} has {n_dims} dimensions")
                shape = tuple(cur.take("Q") for _ in range(n_dims))
                infos.append((name, shape, cur.take("I"), cur.take("Q")))
            align = fields.get("general.alignment") or 32
            if not isinstance(align, int) or align <= 0 or align & (align - 1):
                raise GGUFHeaderError(f"bad general.alignment {align!r}")
            data_offset = -(-cur.pos // align) * align
    tensors = []
    for name, shape, ttype, off in infos:
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (ValueError, KeyError):
            raise GGUFHeaderError(f"tensor {name!r} has unknown type {ttype}") from None
        n = 1
        for d in shape:
            n *= d
        if n % block:
            raise GGUFHeaderError(f"tensor {name!r}: {n} elements is not a multiple of the block size {block}")
        tensors.append(TensorInfo(name, shape, ttype, data_offset + off, n, n // block * type_size))
    return GGUFHeader(version, fields, tensors, data_offset, size)
