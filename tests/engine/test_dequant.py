"""Our torch dequantizers vs gguf.quants.dequantize (the oracle) on random blocks of every type."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize

from engine.loaders.dequant import SUPPORTED_TYPES, dequantize, tensor_nbytes
from gguf_factory import random_k_quant_blocks

ROWS, COLS = 6, 512


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0])
def test_quantizable_types_match_gguf(qtype):
    rng = np.random.default_rng(int(qtype))
    w = (rng.standard_normal((ROWS, COLS)) * rng.uniform(0.01, 3, size=(ROWS, 1))).astype(np.float32)
    w[0, :7] = 0.0  # a block with zeros and tiny values
    raw = quantize(w, qtype)
    expect = gguf_dequantize(raw, qtype).reshape(ROWS, COLS)
    got = dequantize(raw, qtype, (ROWS, COLS))
    assert got.dtype == torch.float32 and got.shape == (ROWS, COLS)
    np.testing.assert_array_equal(got.numpy(), expect)


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q5_K, QT.Q6_K])
def test_k_quants_match_gguf_on_random_blocks(qtype):
    rng = np.random.default_rng(int(qtype))
    raw = random_k_quant_blocks(rng, ROWS, COLS, qtype)
    expect = gguf_dequantize(raw, qtype).reshape(ROWS, COLS)
    got = dequantize(raw, qtype, (ROWS, COLS))
    np.testing.assert_allclose(got.numpy(), expect, rtol=1e-6, atol=1e-7)
    assert np.abs(expect).max() > 0


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q5_K, QT.Q6_K])
def test_k_quants_fully_random_bytes(qtype):
    """Every bit pattern of scales/mins/quants (d, dmin also random, non-finite f16 excluded)."""
    rng = np.random.default_rng(100 + int(qtype))
    raw = rng.integers(0, 256, size=(ROWS, COLS // 256 * tensor_nbytes(qtype, 256)), dtype=np.uint8)
    expect = gguf_dequantize(raw, qtype).reshape(ROWS, COLS)
    got = dequantize(raw, qtype, (ROWS, COLS)).numpy()
    finite = np.isfinite(expect)
    np.testing.assert_allclose(got[finite], expect[finite], rtol=1e-5, atol=1e-30)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # gguf-py's 2^127 * 12
def test_mxfp4_matches_gguf_on_quantized_weights_and_every_bit_pattern():
    """gpt-oss's experts: 32 E2M1 codes and one E8M0 scale a block; random bytes reach every code
    and every scale, the subnormal ones (e < 2) and the largest included."""
    rng = np.random.default_rng(39)
    w = (rng.standard_normal((ROWS, COLS)) * rng.uniform(1e-3, 30, size=(ROWS, 1))).astype(np.float32)
    for raw in (quantize(w, QT.MXFP4), rng.integers(0, 256, size=(ROWS, COLS // 32 * 17), dtype=np.uint8)):
        raw[0, 0], raw[0, 17], raw[1, 0] = 0, 1, 255  # scales 2^-128, 2^-127, 2^127
        expect = gguf_dequantize(raw, QT.MXFP4).reshape(ROWS, COLS)
        np.testing.assert_array_equal(dequantize(raw, QT.MXFP4, (ROWS, COLS)).numpy(), expect)
    assert np.abs(gguf_dequantize(quantize(w, QT.MXFP4), QT.MXFP4).reshape(ROWS, COLS) - w).max() < np.abs(w).max() / 4


def test_all_advertised_types_are_covered():
    assert SUPPORTED_TYPES == {QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0,
                               QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.MXFP4}


def test_wrong_byte_count_is_an_error():
    raw = quantize(np.zeros((2, 64), np.float32), QT.Q8_0)
    with pytest.raises(ValueError, match="bytes"):
        dequantize(raw[:, :-1], QT.Q8_0, (2, 64))
    with pytest.raises(NotImplementedError, match="Q2_K"):
        dequantize(np.zeros(84, np.uint8), QT.Q2_K, (1, 256))
