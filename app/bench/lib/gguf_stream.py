"""A GGUF file written tensor by tensor, and a tokenizer copied from another GGUF.

gguf-py's `GGUFWriter.add_tensor` holds every tensor until the file is written; a file with a
30B model's layer shapes would need tens of GB that way. Here each tensor is planned first (its
name, shape and type: what the header needs), then its values are made, quantized and written a
block of rows at a time, so only one block is ever in memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, TokenType
from gguf.quants import quantize


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor of the file: numpy order shape (outermost first), its stored type (F32 or a
    block type gguf-py quantizes), and `rows()`: its float32 values as [n, shape[-1]] blocks of
    consecutive rows, in order."""
    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    rows: Callable[[], Iterator[np.ndarray]]

    @property
    def nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.qtype]
        return int(np.prod(self.shape)) // block * size


def write_streamed(writer: GGUFWriter, tensors: list[PlannedTensor]) -> None:
    """Write the writer's metadata, then `tensors` one block of rows at a time (gguf-py's own
    layout: every tensor's data aligned to the writer's alignment), and close the file."""
    for t in tensors:
        writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    fout = writer.fout[0]
    for t in tensors:
        writer.write_padding(fout, fout.tell())
        written = 0
        for block in t.rows():
            data = block.astype(np.float32) if t.qtype == GGMLQuantizationType.F32 else quantize(block, t.qtype)
            data.tofile(fout)
            written += data.nbytes
        assert written == t.nbytes, (t.name, written, t.nbytes)
        writer.write_padding(fout, written)
    writer.close()


def copy_tokenizer(writer: GGUFWriter, source: Path, vocab: int | None = None) -> int:
    """Copy every `tokenizer.*` key of the GGUF `source` into `writer`; with `vocab` larger than
    its token list, pad the list with unused `[PAD<i>]` tokens (as llama.cpp's converter pads a
    vocabulary to the embedding's rows). Returns the number of tokens written, which the token
    table and the head must have as rows."""
    reader = GGUFReader(source)
    fields = {k: f for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    count = len(fields["tokenizer.ggml.tokens"].data)
    if vocab is not None and vocab < count:
        raise ValueError(f"{source} has {count} tokens, more than the {vocab} rows asked for")
    pad = (vocab or count) - count
    for key, field in fields.items():
        value, vtype = field.contents(), field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        if pad and key == "tokenizer.ggml.tokens":
            value = value + [f"[PAD{i}]" for i in range(count, count + pad)]
        elif pad and key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            value = value + [TokenType.UNUSED if key.endswith("type") else 0.0] * pad
        writer.add_key_value(key, value, vtype, sub)
    return count + pad
