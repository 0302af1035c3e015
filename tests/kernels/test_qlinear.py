"""torch.ops.ember.qlinear (engine/kernels/csrc/qlinear.cpp) and QuantLinear on every code path.

Reference. The op quantizes x to int8 per row and block of 32 (s = amax/127, q = round(x/s) ties
to even, computed as x * (1/s) in float32; s and a group-32 min's factor s sum(q) then rounded to
float16, as llama.cpp's q8 blocks keep them); the reference does the same in torch float32, then
    y = sum_g [ (d_g s_b) sum(q_w q) + m_g s_b sum(q) ] + bias
in float64, so the op differs from it only by its float32 epilogue: 2 rounded products and 2
fma's per group, a recursive sum of 2 NG terms, bounded by about (2 NG + 2) u sum|terms|. The
test allows (2 NG + 4) eps32 sum|terms| (eps32 = 2u); a wrong scale, group, nibble or min
shows as an error of the size of a term. Against the float64 x W^T the error is what int8
activations imply: |x - s' q| <= s/2 + |s - s'| 127 <= (1/2 + 127 2^-11) s for the float16 s',
so |dy| <= (1/2 + 127 2^-11) sum_k |w_k| s_b(k), plus the epilogue.
"""
from __future__ import annotations

import platform
import zlib

import pytest
import torch

if platform.machine() not in ("x86_64", "AMD64"):
    pytest.skip(f"Ember's CPU kernels are x86-64 only (this machine: {platform.machine()})", allow_module_level=True)

from engine.kernels import CpuPath, available_paths, default_path
from engine.kernels.tiles import to_tiles
from engine.layers.quant_linear import QuantLinear
from engine.weights.quant_weight import QuantWeight
from test_repack import ops_or_skip

OPS = ops_or_skip()
PATHS = available_paths()
EPS32 = torch.finfo(torch.float32).eps
FORMATS = {"w4g32m": (4, 32, True), "w8g32": (8, 32, False), "w8g32m": (8, 32, True),
           "w8g16": (8, 16, False), "w8g16m": (8, 16, True),
           # 8-bit codes in -32..31 (Q6_K's, the Q5 types'), which to_tiles() stores in 6 bits
           "w6g16": (6, 16, False), "w6g16m": (6, 16, True), "w6g32m": (6, 32, True)}
SHAPES = [(N, K) for N in (40, 960, 1) for K in (32, 576, 1536)]
_cache: dict = {}


def make_weight(fmt: str, N: int, K: int, half: bool) -> tuple[QuantWeight, object]:
    """A random QuantWeight (8-bit codes span -128..127, 6-bit ones -32..31) with float16-exact
    or float32 scales, and its pack."""
    key = (fmt, N, K, half)
    if key not in _cache:
        bits, G, has_min = FORMATS[fmt]
        g = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
        if bits == 4:
            q = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
        else:
            span = 32 if bits == 6 else 128
            q = torch.randint(-span, span, (N, K), generator=g, dtype=torch.int8)
        scale = torch.rand(N, K // G, generator=g) * 0.02 + 1e-3
        d = scale * torch.randn(N, K // G, generator=g).sign()
        m = (torch.randn(N, K // G, generator=g) * 0.05) if has_min else None
        if half:  # float16-exact values, as legacy GGUF scales are: to_tiles() keeps them float16
            d = d.half().float()
            d[0, 0] = 2.0 ** -20  # a float16 subnormal
            m = None if m is None else m.half().float()
        w = QuantWeight(4 if bits == 4 else 8, G, q, d, m)
        p = to_tiles(w)
        assert p.d.dtype == (torch.float16 if half else torch.float32) and p.bits == bits
        _cache[key] = w, p
    return _cache[key]


def run(p, x, bias=None, path=0) -> torch.Tensor:
    return OPS.qlinear(x, p.qw, p.d, p.m, bias, p.out_features, p.bits, p.group, int(path))


def quantize_acts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The op's activation quantization in float32: s [M, K/32] unrounded, q [M, K] (integral
    floats), and the float16-rounded min factor half(s sum(q)) [M, K/32]."""
    xb = x.view(x.shape[0], -1, 32)
    s = xb.abs().amax(-1) / 127
    inv = torch.where(s != 0, 1 / s, torch.zeros_like(s))
    q = torch.round(xb * inv[..., None])  # torch.round: ties to even
    return s, q.view_as(x), (s * q.sum(-1)).half().float()


def reference(w: QuantWeight, x: torch.Tensor, bias):
    """float64 y of the int8 arithmetic, the bound on the op's epilogue error, and the bound vs x W^T."""
    (N, K), G, M = w.shape, w.group, x.shape[0]
    s, q, sm = quantize_acts(x)
    s_h = s.half().float()
    s_g = s_h.double().repeat_interleave(32 // G, dim=1)  # [M, NG]: each group's activation scale
    qg = q.double().view(M, -1, G)
    isum = torch.einsum("mgk,ngk->mng", qg, w.q.double().view(N, -1, G))
    t1 = isum * w.d.double()[None] * s_g[:, None]
    # the min's factor: float16 half(s sum q) per 32; per 16, the float32 product s' sum q
    factor = sm.double() if G == 32 else (s_h.repeat_interleave(2, 1) * qg.sum(-1).float()).double()
    t2 = torch.zeros_like(t1) if w.m is None else w.m.double()[None] * factor[:, None]
    y = (t1 + t2).sum(-1)
    mag = (t1.abs() + t2.abs()).sum(-1)
    if bias is not None:
        y, mag = y + bias.double(), mag + bias.double().abs()
    tol = (2 * K // G + 4) * EPS32 * mag
    w64 = w.q.double() * w.d.double().repeat_interleave(G, 1)
    if w.m is not None:
        w64 = w64 + w.m.double().repeat_interleave(G, 1)
    exact = x.double() @ w64.T + (0 if bias is None else bias.double())
    quant_bound = (0.5 + 127 * 2.0 ** -11) * (1 + 1e-5) * s.double().repeat_interleave(32, 1) @ w64.abs().T + tol
    return y, tol, exact, quant_bound


def make_x(M: int, K: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * torch.rand(M, 1, generator=g).add(0.1) * 3
    x[M // 2, :32] *= 100  # an outlier block
    return x


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("N,K", SHAPES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_matches_int8_reference(path, fmt, N, K, bias):
    half = (N + K + int(bias)) % 2 == 1  # float16 and float32 scales, alternating over the grid
    w, p = make_weight(fmt, N, K, half)
    M = 11  # 8 + 2 + 1 rows on AVX-512, 4 + 4 + 2 + 1 on AVX2
    x = make_x(M, K, N * K)
    b = torch.randn(N, generator=torch.Generator().manual_seed(K)) if bias else None
    y = run(p, x, b, path)
    assert y.shape == (M, N) and y.dtype == torch.float32
    ref, tol, exact, quant_bound = reference(w, x, b)
    err = (y.double() - ref).abs()
    assert (err <= tol).all(), f"max err {err.max():.3g}, worst err/tol {(err / tol).max():.3g}"
    err_exact = (y.double() - exact).abs()
    assert (err_exact <= quant_bound).all(), f"vs x W^T: worst err/bound {(err_exact / quant_bound).max():.3g}"
    # and int8 activations are still a fine approximation (loose sanity)
    assert torch.linalg.norm(y.double() - exact) <= 0.05 * torch.linalg.norm(exact)


@pytest.mark.parametrize("N,K", [(40, 576), (960, 1536), (1, 32)])
@pytest.mark.parametrize("half", [False, True], ids=["f32", "f16"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_paths_are_bitwise_identical(fmt, half, N, K):
    _, p = make_weight(fmt, N, K, half)
    x = make_x(37, K, 5)
    b = torch.randn(N)
    ys = {path: run(p, x, b, path) for path in PATHS}
    assert torch.equal(run(p, x, b, 0), ys[PATHS[-1]])  # 0 = the best path
    for path, y in ys.items():
        assert torch.equal(y, ys[PATHS[0]]), f"{path.name} != {PATHS[0].name}"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_batch_invariance(path, fmt):
    N, K = 40, 576
    _, p = make_weight(fmt, N, K, fmt.endswith("m"))
    row = make_x(1, K, 1)
    alone = run(p, row, None, path)
    for M in (1, 2, 3, 7, 16, 33):
        for pos in sorted({0, M // 2, M - 1}):
            x = make_x(M, K, 100 + M)
            x[pos] = row[0]
            y = run(p, x, None, path)
            assert torch.equal(y[pos], alone[0]), f"M={M}, row {pos}"


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.startswith("w6")])
@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_six_bit_storage_gives_the_eight_bit_bits(path, fmt):
    """The same codes stored in 6 bits or in 8: the same integers, the same float epilogue."""
    w, p6 = make_weight(fmt, 40, 576, False)
    p8 = to_tiles(w, narrow=False)
    assert p8.bits == 8 and p6.qw.numel() * 8 == p8.qw.numel() * 6
    for M in (1, 2, 7, 33):  # one row, a few, and enough rows for prepared tiles
        x = make_x(M, 576, 200 + M)
        assert torch.equal(run(p6, x, None, path), run(p8, x, None, path)), f"M={M}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_zero_rows_and_empty_batches(fmt):
    N, K = 40, 576
    _, p = make_weight(fmt, N, K, False)
    b = torch.randn(N)
    x = make_x(5, K, 3)
    x[2] = 0
    for path in PATHS:
        y = run(p, x, b, path)
        assert torch.equal(y[2], b)
        assert torch.equal(run(p, x, None, path)[2], torch.zeros(N))
        assert not torch.equal(y[1], b)
        empty = run(p, x[:0], b, path)
        assert empty.shape == (0, N) and empty.dtype == torch.float32


def test_bad_arguments_are_errors():
    _, p = make_weight("w4g32m", 40, 576, False)
    _, p8 = make_weight("w8g16", 40, 576, False)
    x = make_x(3, 576, 0)
    with pytest.raises(RuntimeError, match="not a multiple of 32"):
        OPS.qlinear(x[:, :48].contiguous(), p.qw, p.d, p.m, None, 40, 4, 32, 0)
    for bad in (99, -1, 4):
        with pytest.raises(RuntimeError, match="does not exist"):
            run(p, x, None, bad)
    for lacking in set(CpuPath) - set(PATHS) - {CpuPath.NONE}:  # refused, naming what the CPU lacks
        with pytest.raises(RuntimeError, match="lacks"):
            run(p, x, None, lacking)
    with pytest.raises(RuntimeError, match="bytes"):
        OPS.qlinear(x, p.qw.flatten()[:-1], p.d, p.m, None, 40, 4, 32, 0)
    with pytest.raises(RuntimeError, match="bytes"):  # N of another tile count
        OPS.qlinear(x, p.qw, p.d, p.m, None, 49, 4, 32, 0)
    with pytest.raises(RuntimeError, match="scales"):
        OPS.qlinear(x, p8.qw, p8.d.flatten()[:-16], None, None, 40, 8, 16, 0)
    with pytest.raises(RuntimeError, match="scales"):  # group 16 scales where group 32 is claimed
        OPS.qlinear(x, p8.qw, p8.d, None, None, 40, 8, 32, 0)
    with pytest.raises(RuntimeError, match="unsupported format"):
        OPS.qlinear(x, p.qw, p.d, p.m, None, 40, 4, 16, 0)
    with pytest.raises(RuntimeError, match="mins"):
        OPS.qlinear(x, p.qw, p.d, None, None, 40, 4, 32, 0)
    with pytest.raises(RuntimeError, match="float32"):
        OPS.qlinear(x.double(), p.qw, p.d, p.m, None, 40, 4, 32, 0)


@pytest.mark.parametrize("fmt", ["w4g32m", "w8g16"])
def test_quant_linear_module(fmt):
    w, p = make_weight(fmt, 40, 576, True)
    b = torch.randn(40)
    for path in [None, *PATHS]:
        layer = QuantLinear(w, bias=b, path=path)
        assert layer.path == int(default_path() if path is None else path)
        x = make_x(6, 576, 9).view(2, 3, 576)
        y = layer(x)
        assert y.shape == (2, 3, 40)
        assert torch.equal(y.view(6, 40), run(p, x.view(6, 576), b, layer.path))
        ids = torch.tensor([39, 0, 17])
        assert torch.equal(layer.rows(ids), w.dequantize()[ids])
    assert isinstance(layer.path, int) and CpuPath(layer.path) in PATHS
