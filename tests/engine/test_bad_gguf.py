"""Damaged or hostile GGUF files -> GGUFError naming the problem, fast, with no big allocation."""
from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter

from engine.loaders.gguf_config import GGUFError, read_model_config
from engine.loaders.gguf_loader import load_model
from gguf_factory import write_tiny_model

pytestmark = pytest.mark.timeout(30)


def _raises(path, match: str) -> GGUFError:
    """Both entry points refuse the file quickly with a message matching `match`."""
    t0 = time.perf_counter()
    with pytest.raises(GGUFError, match=match) as info:
        load_model(path)
    assert time.perf_counter() - t0 < 5
    assert str(path) in str(info.value)
    return info.value


@pytest.fixture
def good(tmp_path):
    return write_tiny_model(tmp_path / "good.gguf")


@pytest.mark.parametrize("keep", [0.3, 0.9, 0.999])
def test_truncated_file(good, tmp_path, keep):
    data = good.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: int(len(data) * keep)])
    _raises(bad, "truncated")


def test_truncated_inside_header(good, tmp_path):
    bad = tmp_path / "head.gguf"
    bad.write_bytes(good.read_bytes()[:200])
    _raises(bad, "truncated|corrupt")
    bad.write_bytes(good.read_bytes()[:10])
    _raises(bad, "truncated")


def test_wrong_magic(good, tmp_path):
    bad = tmp_path / "magic.gguf"
    bad.write_bytes(b"GGML" + good.read_bytes()[4:])
    _raises(bad, "not a GGUF file")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    _raises(empty, "not a GGUF file")
    with pytest.raises(GGUFError, match="no such file"):
        read_model_config(tmp_path / "absent.gguf")


def test_header_counts_beyond_file(good, tmp_path):
    data = bytearray(good.read_bytes())
    data[8:16] = struct.pack("<Q", 2**50)  # n_tensors
    bad = tmp_path / "count.gguf"
    bad.write_bytes(bytes(data))
    _raises(bad, "header claims")


def test_unsupported_tensor_type(tmp_path):
    path = write_tiny_model(tmp_path / "iq.gguf", tensor_types={"blk.1.ffn_up.weight": QT.IQ4_NL})
    err = _raises(path, "blk.1.ffn_up.weight")
    assert "IQ4_NL" in str(err) and "Q4_K" in str(err)  # says what it got and what it supports


def test_unknown_architecture(tmp_path):
    path = tmp_path / "arch.gguf"
    w = GGUFWriter(str(path), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    _raises(path, "unsupported architecture 'mamba'")


def test_missing_tensor(tmp_path):
    path = write_tiny_model(tmp_path / "miss.gguf", drop_tensors=("blk.1.attn_k.weight",))
    _raises(path, "missing tensor blk.1.attn_k.weight")


def test_shape_disagrees_with_metadata(tmp_path):
    path = write_tiny_model(tmp_path / "shape.gguf", metadata={"feed_forward_length": 96})
    _raises(path, r"blk.0.ffn_gate.weight has shape \(128, 64\) but the metadata implies \(96, 64\)")


def test_more_layers_than_tensors(tmp_path):
    path = write_tiny_model(tmp_path / "layers.gguf", metadata={"block_count": 3})
    _raises(path, "missing tensor blk.2.")


@pytest.mark.parametrize("key,value", [("block_count", 10**9), ("embedding_length", 2**40),
                                       ("context_length", 2**40), ("attention.head_count", 0)])
def test_absurd_dimensions(tmp_path, key, value):
    path = write_tiny_model(tmp_path / "absurd.gguf", metadata={key: value})
    _raises(path, f"absurd .*{key} = {value}")


def test_absurd_tensor_shape_without_data(tmp_path):
    """A tensor whose directory entry claims 2**42 elements: refused before any allocation."""
    path = tmp_path / "huge.gguf"
    w = GGUFWriter(str(path), "llama")
    for key, value in [("embedding_length", 64), ("block_count", 1), ("feed_forward_length", 128),
                       ("attention.head_count", 4), ("context_length", 512)]:
        w.add_uint32(f"llama.{key}", value)
    w.add_tensor_info("token_embd.weight", [2**36, 64], np.dtype(np.float32), 2**44, raw_dtype=QT.F32)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_ti_data_to_file(); w.close()
    _raises(path, "absurd vocab_size = 68719476736")
