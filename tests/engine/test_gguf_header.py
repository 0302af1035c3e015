"""The one GGUF header reader (engine/model_files/gguf_file.py) against gguf.GGUFReader (the oracle),
and against corrupt headers."""
from __future__ import annotations

import random

import gguf
import numpy as np
import pytest

from engine.model_files.gguf_file import EAGER_ARRAY_MAX, GGUFFile, GGUFFormatError, LazyArray
from engine.model_files.meta import ModelFileError, read_gguf_meta
from store_helpers import bundled_model_or_skip, write_tiny_gguf


def _compare_with_gguf_reader(path):
    ours = GGUFFile(path)
    ref = gguf.GGUFReader(path)
    assert ours.data_offset == ref.data_offset
    assert [(t.name, t.offset, t.n_elements, t.nbytes, t.qtype) for t in ours.tensors.values()] == [
        (t.name, int(t.data_offset), int(t.n_elements), int(t.n_bytes), int(t.tensor_type)) for t in ref.tensors]
    for key, fld in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        value = fld.contents()
        if isinstance(value, list) and len(value) > EAGER_ARRAY_MAX:
            assert isinstance(ours.metadata[key], LazyArray)  # left unread until asked for
        got = ours.get(key)
        assert got == (pytest.approx(value) if isinstance(value, float) else value), (key, got, value)
    return ours


def test_matches_gguf_reader_on_written_files(tmp_path):
    path = write_tiny_gguf(tmp_path / "a.gguf", pad_mb=0.1)
    w = gguf.GGUFWriter(str(tmp_path / "b.gguf"), "qwen2")
    w.add_block_count(1)
    w.add_head_count_kv([2, 4, 2])  # per-layer arrays exist (e.g. OpenELM)
    w.add_rope_freq_base(1e6)
    w.add_array("test.strings", ["a", "bé", ""])
    w.add_array("test.big", list(range(5000)))
    w.add_token_list([f"t{i}" for i in range(300)])
    w.add_tensor("q8.weight", gguf.quants.quantize(np.ones((4, 64), np.float32), gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("f16.weight", np.ones((3, 5), np.float16))
    for step in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file, w.close):
        step()
    _compare_with_gguf_reader(path)
    h = _compare_with_gguf_reader(tmp_path / "b.gguf")
    assert h.get("qwen2.attention.head_count_kv") == [2, 4, 2]
    assert h.tensors["q8.weight"].nbytes == 4 * 64 // 32 * 34  # Q8_0: 32 weights in 34 bytes


@pytest.mark.slow
def test_matches_gguf_reader_on_the_bundled_model():
    _compare_with_gguf_reader(bundled_model_or_skip())


def test_corrupt_headers_raise_clear_errors(tmp_path):
    good = write_tiny_gguf(tmp_path / "a.gguf").read_bytes()
    rng = random.Random(0)
    bad = tmp_path / "bad.gguf"
    for cut in range(4, 700, 7):  # every truncation of the header
        bad.write_bytes(good[:cut])
        with pytest.raises(ModelFileError):
            read_gguf_meta(bad)
    for _ in range(300):  # random byte flips: an error or a result, never another exception
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(4, 700)] = rng.randrange(256)
        bad.write_bytes(bytes(data))
        try:
            read_gguf_meta(bad)
        except ModelFileError:
            pass
    data = bytearray(good)  # a layer count no file could hold: refused, not a 2**31-entry tuple
    at = good.index(b"llama.block_count") + len(b"llama.block_count") + 4  # after the key, its type
    data[at:at + 4] = (2**31 - 2).to_bytes(4, "little")
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="implausible llama.block_count 2147483646"):
        read_gguf_meta(bad)
    data = bytearray(good)
    data[8:16] = (2**60).to_bytes(8, "little")  # absurd tensor count: refused before any allocation
    bad.write_bytes(bytes(data))
    with pytest.raises(GGUFFormatError, match="implausible"):
        GGUFFile(bad)
