"""GGUF blocks -> QuantWeight (engine/loaders/gguf_blocks.py) and its tile packing (engine/kernels/tiles.py).

The oracle is gguf.quants.dequantize: a repacked weight must dequantize to exactly its values,
on random bytes (every bit pattern of codes and sub-scales; finite f16 scales over the whole f16
range, subnormals included) and on blocks gguf-py quantizes from real floats. Then the
QuantWeight operations (cat_rows of mixed formats, rows) and to_tiles() + the qrows op must keep
those values exactly.
"""
from __future__ import annotations

import platform

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from engine.kernels import kernels
from engine.kernels.tiles import to_tiles
from engine.loaders.gguf_blocks import REPACKABLE, from_gguf_blocks
from engine.weights.quant_weight import QuantWeight, cat_rows

TYPES = sorted(REPACKABLE, key=lambda t: t.name)
K_QUANTS = {QT.Q4_K, QT.Q5_K, QT.Q6_K}
# Byte offsets of the f16 fields (d, and m / dmin) in one block (ggml-common.h).
F16_FIELDS = {QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2), QT.Q8_0: (0,),
              QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,)}
# qtype -> bits, group, code dtype, code range, has a min
FORMATS = {QT.Q4_0: (4, 32, torch.uint8, (0, 15), True), QT.Q4_1: (4, 32, torch.uint8, (0, 15), True),
           QT.Q4_K: (4, 32, torch.uint8, (0, 15), True), QT.Q5_0: (8, 32, torch.int8, (-16, 15), False),
           QT.Q5_1: (8, 32, torch.int8, (0, 31), True), QT.Q5_K: (8, 32, torch.int8, (0, 31), True),
           QT.Q6_K: (8, 16, torch.int8, (-32, 31), False), QT.Q8_0: (8, 32, torch.int8, (-128, 127), False)}
SHAPES = [(40, 512), (1, 256), (7, 768)]


def random_f16(rng: np.random.Generator, shape) -> np.ndarray:
    """Finite float16 values of random sign over the whole range, subnormals and zeros included."""
    bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF  # inf/nan exponent -> a finite one
    return bits.view(np.float16)


def ops_or_skip():
    """torch.ops.ember; skips off x86-64 and fails, with the fix, when it is not built there."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"Ember's CPU kernels are x86-64 only (this machine: {platform.machine()})")
    ops = kernels()
    assert ops is not None, "Ember's CPU kernels did not load: run `make install` (python -m engine.kernels.build)"
    return ops


def random_blocks(rng: np.random.Generator, qtype: QT, N: int, K: int) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qtype]
    nb = N * K // block
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        raw[:, off:off + 2] = random_f16(rng, (nb, 1)).view(np.uint8)
    return raw.reshape(N, -1)


def check_exact(raw: np.ndarray, qtype: QT, N: int, K: int) -> QuantWeight:
    w = from_gguf_blocks(torch.from_numpy(raw.copy()), qtype, (N, K))
    got = w.dequantize()
    expect = gguf_dequantize(raw.reshape(N, -1), qtype).reshape(N, K)
    assert got.dtype == torch.float32 and got.shape == (N, K)
    assert np.isfinite(expect).all() and np.abs(expect).max() > 0
    bad = np.flatnonzero(got.numpy() != expect)
    assert bad.size == 0, f"{bad.size} values differ, first at {np.unravel_index(bad[0], (N, K))}: " \
                          f"{got.numpy().flat[bad[0]]!r} != {expect.flat[bad[0]]!r}"
    return w


@pytest.mark.parametrize("N,K", SHAPES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_random_blocks_dequantize_exactly(qtype, N, K):
    rng = np.random.default_rng([int(qtype), N, K])
    check_exact(random_blocks(rng, qtype, N, K), qtype, N, K)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_quantized_floats_dequantize_exactly(qtype):
    N, K = 12, 512
    rng = np.random.default_rng(int(qtype))
    x = (rng.standard_normal((N, K)) * rng.uniform(1e-3, 3, size=(N, 1))).astype(np.float32)
    x[0, :40] = 0.0  # an all-zero block
    x[1, 5] = 40.0  # an outlier
    try:
        raw = gguf_quantize(x, qtype)
    except NotImplementedError:
        pytest.skip(f"gguf-py cannot quantize {qtype.name}")
    w = check_exact(raw, qtype, N, K)
    assert torch.equal(w.dequantize()[0, :32], torch.zeros(32))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_format_of_each_type(qtype):
    N, K = 40, 512
    w = from_gguf_blocks(torch.from_numpy(random_blocks(np.random.default_rng(7), qtype, N, K)), qtype, (N, K))
    bits, group, dtype, (lo, hi), has_min = FORMATS[qtype]
    assert (w.bits, w.group, w.q.dtype, w.shape) == (bits, group, dtype, (N, K))
    # random bytes reach both ends of the code range
    assert (int(w.q.min()), int(w.q.max())) == (lo, hi)
    assert w.d.dtype == torch.float32 and w.d.shape == (N, K // group)
    assert (w.m is not None) == has_min
    if has_min:
        assert w.m.dtype == torch.float32 and w.m.shape == (N, K // group)


def test_repack_rejects_unknown_types():
    with pytest.raises(NotImplementedError, match="Q2_K"):
        from_gguf_blocks(torch.zeros(84, dtype=torch.uint8), QT.Q2_K, (1, 256))


def _weight(qtype: QT, N: int, K: int, seed: int) -> tuple[QuantWeight, torch.Tensor]:
    raw = random_blocks(np.random.default_rng([seed, int(qtype)]), qtype, N, K)
    return from_gguf_blocks(torch.from_numpy(raw), qtype, (N, K)), torch.from_numpy(gguf_dequantize(raw, qtype).reshape(N, K))


@pytest.mark.parametrize("parts,fmt", [((QT.Q4_K, QT.Q6_K), (8, 16, True)), ((QT.Q4_1, QT.Q8_0), (8, 32, True)),
                                       ((QT.Q6_K, QT.Q5_0), (8, 16, False)), ((QT.Q4_0, QT.Q4_K), (4, 32, True)),
                                       ((QT.Q5_K, QT.Q4_0, QT.Q6_K), (8, 16, True))],
                         ids=lambda v: "+".join(t.name for t in v) if isinstance(v[0], QT) else None)
def test_cat_rows_of_mixed_formats_is_exact(parts, fmt):
    K = 512
    ws = [_weight(t, 5 + 11 * i, K, i) for i, t in enumerate(parts)]
    w = cat_rows([p for p, _ in ws])
    assert (w.bits, w.group, w.m is not None) == fmt
    assert w.shape == (sum(p.shape[0] for p, _ in ws), K)
    assert torch.equal(w.dequantize(), torch.cat([ref for _, ref in ws]))


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q5_0], ids=lambda t: t.name)
def test_rows_permute_exactly(qtype):
    w, ref = _weight(qtype, 40, 256, 3)
    perm = torch.randperm(40, generator=torch.Generator().manual_seed(0))
    p = w.rows(perm)
    assert (p.bits, p.group) == (w.bits, w.group)
    assert torch.equal(p.dequantize(), ref[perm])


def test_pack_keeps_float16_scales_only_when_exact():
    legacy, _ = _weight(QT.Q4_1, 40, 256, 0)
    kquant, _ = _weight(QT.Q4_K, 40, 256, 0)
    assert to_tiles(legacy).d.dtype == to_tiles(legacy).m.dtype == torch.float16
    # K-quants pack as the file factors them: float16 per 256 values times an 8-bit code per group
    k = to_tiles(kquant)
    assert k.d.dtype == k.m.dtype == torch.int8 and k.d_super.dtype == k.m_super.dtype == torch.float16
    assert k.d_super.shape == (3, 1, 16) and k.d.shape == (3, 8, 16)
    sup = kquant.sup
    assert torch.equal(sup.d.repeat_interleave(8, 1) * sup.d_code.float(), kquant.d)  # the same products
    assert torch.equal(sup.m.repeat_interleave(8, 1) * sup.m_code.float(), kquant.m)
    # without the factoring, d sc needs float32
    plain = QuantWeight(4, 32, kquant.q, kquant.d, kquant.m)
    assert to_tiles(plain).d.dtype == to_tiles(plain).m.dtype == torch.float32
    # one scale that float16 cannot hold makes the whole weight float32
    d = legacy.d.clone()
    d[3, 1] = 1 + 2 ** -12
    assert to_tiles(QuantWeight(4, 32, legacy.q, d, legacy.m)).d.dtype == torch.float32
    # padded to 16 columns: [N/16, K/G, 16]
    assert to_tiles(legacy).d.shape == (3, 8, 16) and to_tiles(legacy).qw.shape == (3, 8, 4, 64)


def test_pack_rejects_bad_shapes():
    w, _ = _weight(QT.Q8_0, 2, 64, 0)
    with pytest.raises(ValueError, match="multiple of 32"):
        to_tiles(QuantWeight(8, 16, w.q[:, :48], w.d.repeat_interleave(2, 1)[:, :3], None))
    with pytest.raises(ValueError, match="6-bit"):
        to_tiles(QuantWeight(6, 32, w.q, w.d, None))


def _qrows(w: QuantWeight, ids: torch.Tensor) -> torch.Tensor:
    p = to_tiles(w)
    return ops_or_skip().qrows(p.qw, p.d, p.m, ids, p.in_features, p.bits, p.group, p.d_super, p.m_super,
                               p.out_features)


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q5_K, QT.Q6_K])
def test_factored_k_quant_scales_give_the_bits_of_float32_ones(qtype):
    """qlinear on the file's factoring (float16 per 256 times a code) and on float32 d sc: the
    same products, so the same bits, on every path; with few rows (the scales converted in the
    kernels) and many (prepared tiles: the scales multiplied out once per tile), and a row's
    bits the same alone as among 32 others."""
    from engine.kernels import available_paths

    ops = ops_or_skip()
    w, _ = _weight(qtype, 40, 512, 4)
    factored, plain = to_tiles(w), to_tiles(QuantWeight(w.bits, w.group, w.q, w.d, w.m))
    assert factored.d_super is not None and plain.d_super is None and factored.nbytes() < plain.nbytes()
    for rows in (5, 33):
        x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
        for path in available_paths():
            ys = [ops.qlinear(x, p.qw, p.d, p.m, None, 40, p.bits, p.group, int(path), p.d_super, p.m_super)
                  for p in (factored, plain)]
            assert torch.equal(ys[0], ys[1]), (path, rows)
            alone = ops.qlinear(x[-1:].clone(), factored.qw, factored.d, factored.m, None, 40, factored.bits,
                                factored.group, int(path), factored.d_super, factored.m_super)
            assert torch.equal(ys[0][-1:], alone), (path, rows)


@pytest.mark.parametrize("N", [40, 1, 16])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_qrows_reads_back_exact_rows(qtype, N):
    w, ref = _weight(qtype, N, 512, N)
    ids = torch.cat((torch.randint(0, N, (9,), generator=torch.Generator().manual_seed(N)), torch.tensor([N - 1, 0])))
    got = _qrows(w, ids)
    assert got.dtype == torch.float32 and got.shape == (11, 512)
    assert torch.equal(got, ref[ids])


def test_qrows_of_mixed_rows():
    (a, ra), (b, rb) = _weight(QT.Q4_K, 24, 256, 1), _weight(QT.Q6_K, 9, 256, 2)
    ids = torch.tensor([32, 0, 23, 24, 5, 30])
    assert torch.equal(_qrows(cat_rows([a, b]), ids), torch.cat((ra, rb))[ids])
    with pytest.raises(RuntimeError, match="out of range"):
        _qrows(a, torch.tensor([32]))
    with pytest.raises(RuntimeError, match="out of range"):  # past N = 24, inside the padded tile
        _qrows(a, torch.tensor([3, 25]))
