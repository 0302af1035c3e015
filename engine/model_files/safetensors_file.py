"""A safetensors file read without torch: its JSON header (checked against the file's size) and its
float tensors as numpy arrays over a memory map. numpy has no bfloat16, so BF16 is widened to
float32 here (its 16 bits are the top half of a float32); the `safetensors` package's numpy
loader refuses it."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from engine.model_files.errors import ModelFileError

MAX_HEADER_BYTES = 16 << 20  # a header larger than this is not a real model's
_FLOATS = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": np.uint16}


def safetensors_header(path: Path) -> dict:
    """The header: a u64 little-endian length, then that many bytes of JSON naming each tensor's
    dtype, shape and byte range after the header."""
    return _header_and_start(Path(path))[0]


def _header_and_start(path: Path) -> tuple[dict, int]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ModelFileError(f"{path}: truncated safetensors file")
        (n,) = struct.unpack("<Q", raw)
        if n > min(MAX_HEADER_BYTES, size - 8):
            raise ModelFileError(f"{path}: corrupt safetensors header length {n}")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ModelFileError(f"{path}: corrupt safetensors header: {e}") from e
    if not isinstance(header, dict):
        raise ModelFileError(f"{path}: corrupt safetensors header")
    end = 0
    for name, info in header.items():
        if name != "__metadata__":
            try:
                end = max(end, int(info["data_offsets"][1]))
            except (KeyError, TypeError, ValueError, IndexError):
                raise ModelFileError(f"{path}: corrupt safetensors header entry for {name!r}") from None
    if 8 + n + end > size:
        raise ModelFileError(f"{path}: truncated: tensors need {8 + n + end} bytes, file has {size}")
    return header, 8 + n


def float_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of the file as a read-only array in its own dtype (BF16 as float32); a tensor
    that is not floating point (an int64 `position_ids` buffer) is left out."""
    header, start = _header_and_start(Path(path))
    data = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info.get("dtype") not in _FLOATS:
            continue
        try:
            begin, end = (int(x) for x in info["data_offsets"])
            shape = tuple(int(d) for d in info["shape"])
        except (KeyError, TypeError, ValueError):
            raise ModelFileError(f"{path}: corrupt safetensors header entry for {name!r}") from None
        dtype = np.dtype(_FLOATS[info["dtype"]]).newbyteorder("<")
        if (end - begin) != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
            raise ModelFileError(f"{path}: tensor {name!r} has {end - begin} bytes for shape {list(shape)}")
        array = data[start + begin:start + end].view(dtype).reshape(shape)
        if info["dtype"] == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        out[name] = array
    return out
