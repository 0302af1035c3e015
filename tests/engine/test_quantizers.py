"""RTN, GPTQ and AWQ on plain tensors, each held to an oracle written here from its formula
(float64, loop by loop) or to the property the method exists for (a lower output error)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.quant.awq import awq_quantize, search_clip, search_scales
from engine.quant.gptq import GPTQ
from engine.weights.rtn import as_groups, group_params, rtn, search_group_params


def correlated(T: int, K: int, seed: int, tokens: int = 0) -> torch.Tensor:
    """Tokens x = z A: correlated features of unequal scales, as a transformer's inputs are
    (seed picks the mixing A, tokens the draws z)."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(K, K, generator=g) / K ** 0.5 + torch.eye(K)
    A = A * torch.rand(K, generator=g).add(0.2)[None, :]
    return torch.randn(T, K, generator=torch.Generator().manual_seed(1000 + tokens)) @ A


def out_err(x: torch.Tensor, w: torch.Tensor, wq: torch.Tensor) -> float:
    x, d = x.double(), (w.double() - wq.double())
    return float(((x @ d.T) ** 2).sum())


def oracle_group(v: np.ndarray, bits: int, sym: bool) -> tuple[float, float, np.ndarray]:
    """GPTQ quant.py's rule for one group, in float64 with numpy (sym: 2 max|w| / maxq)."""
    maxq = 2 ** bits - 1
    lo, hi = min(v.min(), 0.0), max(v.max(), 0.0)
    if sym:
        hi = max(-lo, hi)
        lo = -hi
    if lo == 0 and hi == 0:
        lo, hi = -1.0, 1.0
    scale = float(np.float16((hi - lo) / maxq))
    zero = float((maxq + 1) // 2) if sym else float(np.clip(np.round(-lo / scale), 0, maxq))
    q = np.clip(np.round(v / scale) + zero, 0, maxq)
    return scale, zero, q


def obq_oracle(w: np.ndarray, H: np.ndarray, bits: int, G: int, sym: bool, desc_act: bool, static: bool, damp: float):
    """Frantar et al.'s OBQ/GPTQ step in float64 with an explicit inverse of the remaining
    Hessian at every step (no Cholesky, no lazy batches): codes, scales, zeros, loss."""
    N, K = w.shape
    W = w.copy()
    H = H.copy()
    perm = np.argsort(-np.diag(H), kind="stable") if desc_act else np.arange(K)
    ng = -(-K // G)
    S, Z = np.zeros((N, ng)), np.zeros((N, ng))
    if static:
        for g in range(ng):
            for n in range(N):
                S[n, g], Z[n, g], _ = oracle_group(W[n, g * G:(g + 1) * G], bits, sym)
    W, H = W[:, perm], H[np.ix_(perm, perm)]
    H = H + damp * np.mean(np.diag(H)) * np.eye(K)
    Q = np.zeros((N, K))
    loss = 0.0
    for i in range(K):
        g = perm[i] // G if static else i // G
        if not static and i % G == 0:
            for n in range(N):
                S[n, g], Z[n, g], _ = oracle_group(W[n, i:i + G], bits, sym)
        Hf = np.linalg.inv(H[i:, i:])  # inverse Hessian of the columns not yet quantized
        q = np.clip(np.round(W[:, i] / S[:, g]) + Z[:, g], 0, 2 ** bits - 1)
        Q[:, i] = q
        dq = S[:, g] * (q - Z[:, g])
        e = (W[:, i] - dq) / Hf[0, 0]
        loss += ((W[:, i] - dq) ** 2 / Hf[0, 0]).sum() / 2
        W[:, i:] -= np.outer(e, Hf[0, :])
    g_idx = np.empty(K, dtype=np.int64)
    g_idx[perm] = perm // G if static else np.arange(K) // G
    return Q[:, np.argsort(perm)], S, Z, g_idx, loss


# --- RTN ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("group_size", [16, 24, -1])  # 24 does not divide K = 80: a short last group
def test_rtn_matches_float64_oracle(bits, sym, group_size):
    torch.manual_seed(0)
    w = torch.randn(6, 80, dtype=torch.float64) * torch.logspace(-3, 1, 6, dtype=torch.float64)[:, None]
    w[2] = 0  # an all-zero row: a valid scale, codes that dequantize to 0
    w[3] = w[3].abs()  # all non-negative: sym still covers the range
    iw = rtn(w, bits, group_size, sym)
    G = 80 if group_size == -1 else group_size
    assert iw.q.dtype == torch.uint8 and iw.zeros.dtype == torch.uint8 and iw.scales.dtype == torch.float32
    assert iw.g_idx is None and iw.n_groups == -(-80 // G)
    assert torch.equal(iw.scales.half().float(), iw.scales)
    assert int(iw.q.max()) <= 2 ** bits - 1
    wn = w.numpy()
    for n in range(6):
        for g in range(iw.n_groups):
            s, z, q = oracle_group(wn[n, g * G:(g + 1) * G], bits, sym)
            assert iw.scales[n, g].item() == s and iw.zeros[n, g].item() == z
            assert np.array_equal(iw.q[n, g * G:(g + 1) * G].numpy(), q)
    assert not iw.dequantize()[2].any()
    # round to nearest: inside the clamp range every weight is within half a step
    err = (iw.dequantize().double() - w).abs()
    step = iw.scales[:, iw.groups()].double()
    clamped = (iw.q == 0) | (iw.q == 2 ** bits - 1)
    assert bool(((err <= step / 2 * (1 + 1e-9)) | clamped).all())


def test_group_params_float32_is_float16_and_sym_zero():
    w = torch.randn(5, 32) * 0.02
    s, z = group_params(w, 4, True)
    assert s.dtype == torch.float32 and torch.equal(s.half().float(), s) and torch.equal(z, torch.full((5,), 8.0))
    s, z = group_params(w, 8, True)
    assert torch.equal(z, torch.full((5,), 128.0))
    s, z = group_params(torch.zeros(3, 32), 4, False)
    assert bool((s > 0).all())


@pytest.mark.parametrize("sym", [True, False])
def test_search_group_params_is_the_best_shrink_by_a_float64_oracle(sym):
    """Each group's range is the shrink of 1, 0.99, ..., 0.2 with the least sum |w - deq|^2.4
    (GPTQ quant.py's mse search), checked group by group against numpy in float64."""
    w = torch.randn(6, 5, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    scale, zero = search_group_params(w, 4, sym)
    for n in range(6):
        for g in range(5):
            v = w[n, g].numpy()
            errs = []
            for i in range(81):
                s, z, _ = oracle_group(v * (1 - i / 100), 4, sym)
                q = np.clip(np.round(v / s) + z, 0, 15)
                errs.append((np.sum(np.abs(v - s * (q - z)) ** 2.4), s, z))
            best = min(errs, key=lambda e: e[0])  # the first of equal errors, as the search keeps
            assert (scale[n, g].item(), zero[n, g].item()) == (best[1], best[2])
    base_scale, _ = group_params(w, 4, sym)
    assert (scale <= base_scale).all() and (scale < base_scale).any()  # some groups got a finer step


# --- GPTQ --------------------------------------------------------------------------------

@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("group_size", [32, 128, -1])
def test_gptq_beats_rtn_on_correlated_inputs(sym, group_size):
    N, K = 48, 256
    x, x_test = correlated(2048, K, seed=1), correlated(1024, K, seed=1, tokens=1)  # same mixing, unseen tokens
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(2)) * 0.05
    gq = GPTQ(K)
    for t in range(0, 2048, 512):
        gq.add_batch(x[t:t + 512])
    iw = gq.quantize(w, 4, group_size, sym)
    r = rtn(w, 4, group_size, sym).dequantize()
    assert iw.g_idx is None and torch.equal(iw.scales.half().float(), iw.scales)
    assert out_err(x, w, iw.dequantize()) < 0.75 * out_err(x, w, r)
    assert out_err(x_test, w, iw.dequantize()) < 0.85 * out_err(x_test, w, r)

    iwa = gq.quantize(w, 4, group_size, sym, desc_act=True)
    assert out_err(x, w, iwa.dequantize()) < 0.75 * out_err(x, w, r)
    G = K if group_size == -1 else group_size
    perm = torch.argsort(torch.diag(x.double().T @ x.double()), descending=True)
    assert iwa.g_idx.dtype == torch.int32
    assert torch.equal(torch.bincount(iwa.g_idx.long()), torch.full((K // G,), G))
    expect = torch.empty(K, dtype=torch.long)
    expect[perm] = torch.arange(K) // G
    assert torch.equal(iwa.g_idx.long(), expect)
    if G < K:
        assert not torch.equal(iwa.g_idx.long(), torch.arange(K) // G)  # really non-contiguous
        qw = iwa.to_quant_weight()  # the kernels can take it (input columns permuted once)
        assert qw is not None and qw.perm is not None


@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("group_size", [8, -1])
def test_gptq_with_uncorrelated_inputs_is_rtn(sym, group_size):
    """A diagonal H (damped or not) has a diagonal inverse: no error reaches another column,
    so each column is rounded on its own, exactly as RTN does (H = I is the special case)."""
    K = 32
    x = torch.diag(torch.linspace(0.5, 3.0, K))  # H = 2/K diag(d^2)
    w = torch.randn(7, K, generator=torch.Generator().manual_seed(3))
    gq = GPTQ(K)
    gq.add_batch(x)
    got, want = gq.quantize(w, 4, group_size, sym, block_size=5), rtn(w, 4, group_size, sym)
    assert torch.equal(got.q, want.q) and torch.equal(got.scales, want.scales) and torch.equal(got.zeros, want.zeros)
    # with the range search, each group's scale and zero are search_group_params' of its values
    got = gq.quantize(w, 4, group_size, sym, block_size=5, mse=True)
    scale, zero = search_group_params(as_groups(w, group_size), 4, sym)
    assert torch.equal(got.scales, scale.float()) and torch.equal(got.zeros, zero.to(torch.uint8))
    assert not torch.equal(got.scales, want.scales)


@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("desc_act,static", [(False, False), (True, False), (True, True), (False, True)])
def test_gptq_matches_obq_oracle(sym, desc_act, static):
    N, K, G = 5, 14, 4  # groups straddle the blocks of 5: lazy updates pending at a group start
    x = correlated(60, K, seed=4).double()
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    gq = GPTQ(K)
    gq.add_batch(x[:25])
    gq.add_batch(x[25:])
    H = (2 / 60 * x.T @ x).numpy()
    Q, S, Z, g_idx, loss = obq_oracle(w.numpy(), H, 4, G, sym, desc_act, static, 0.01)
    for bs in (5, K):
        iw = gq.quantize(w, 4, G, sym, desc_act=desc_act, static_groups=static, block_size=bs)
        assert np.array_equal(iw.q.numpy(), Q)
        assert np.array_equal(iw.scales.double().numpy(), S) and np.array_equal(iw.zeros.numpy(), Z)
        assert (iw.g_idx is None) == (not desc_act)
        assert np.array_equal(iw.groups().numpy(), g_idx)
        # U is rounded to float32 (gptq.py: what makes the bytes the same on every CPU), so the
        # loss agrees to float32's digits; the codes above agree exactly
        assert gq.last_loss == pytest.approx(loss, rel=1e-6)


def test_gptq_loss_is_the_damped_quadratic_error():
    N, K = 16, 64
    x = correlated(512, K, seed=6)
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(7)) * 0.1
    gq = GPTQ(K)
    gq.add_batch(x)
    d = (w - gq.quantize(w, 4, 32, False, desc_act=True, block_size=16).dequantize()).double()
    Hd = gq.H + 0.01 * gq.H.diag().mean() * torch.eye(K, dtype=torch.float64)
    assert gq.last_loss == pytest.approx(0.5 * float(((d @ Hd) * d).sum()), rel=1e-3)


def test_gptq_dead_inputs_get_zero_weights():
    K = 48
    x = correlated(256, K, seed=8)
    x[:, [3, 17, 40]] = 0
    w = torch.randn(8, K)
    gq = GPTQ(K)
    gq.add_batch(x)
    for desc_act in (False, True):
        wq = gq.quantize(w, 4, 16, False, desc_act=desc_act).dequantize()
        assert torch.isfinite(wq).all() and not wq[:, [3, 17, 40]].any()
        assert out_err(x, w, wq) < out_err(x, w, rtn(w, 4, 16, False).dequantize())


def test_gptq_rejects_bad_input():
    gq = GPTQ(8)
    with pytest.raises(ValueError, match="add_batch"):
        gq.quantize(torch.randn(4, 8), 4, -1, True)
    with pytest.raises(ValueError, match="features"):
        gq.add_batch(torch.randn(3, 9))


# --- AWQ ---------------------------------------------------------------------------------

def outlier_inputs(T: int, K: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g)
    x[:, torch.randperm(K, generator=g)[:4]] *= 30  # a few salient channels, as in LLM activations
    return x


@pytest.mark.parametrize("sym", [False, True])
def test_awq_scales_beat_rtn_with_outlier_channels(sym):
    K = 128
    x = outlier_inputs(1024, K, seed=9)
    g = torch.Generator().manual_seed(10)
    ws = [torch.randn(32, K, generator=g) * 0.05, torch.randn(16, K, generator=g) * 0.05]

    def loss(s, x=x):  # the calibration loss, in float64, from the definition
        return sum(out_err(x, w, rtn(w * s, 4, 32, sym).dequantize() / s) for w in ws)

    def grid_best(x):  # the best candidate of the grid alpha = 0, 1/20, ..., 19/20
        cands = [x.abs().mean(0).pow(a / 20).clamp(min=1e-4) for a in range(20)]
        return min(loss(c / (c.max() * c.min()).sqrt(), x) for c in cands)

    s = search_scales(x, ws, 4, 32, sym)
    assert s.dtype == torch.float32 and s.shape == (K,) and bool((s > 0).all())
    assert loss(s) < 0.8 * loss(torch.ones(K))
    assert loss(s) == pytest.approx(grid_best(x), rel=1e-4)  # T > K: searched on the Gram matrix
    x_few = x[:96]  # T < K: searched on the tokens themselves
    assert loss(search_scales(x_few, ws, 4, 32, sym), x_few) == pytest.approx(grid_best(x_few), rel=1e-4)
    sd = search_scales(x, ws, 4, 32, sym, duo_scaling=True)
    assert loss(sd) <= loss(torch.ones(K)) * (1 + 1e-6)


def test_awq_never_worse_than_rtn_without_outliers():
    """No salient channels: the search may keep s = 1, but never anything worse."""
    K = 64
    x = torch.randn(512, K, generator=torch.Generator().manual_seed(11))
    w = torch.randn(24, K, generator=torch.Generator().manual_seed(12))
    s = search_scales(x, [w], 4, 16)
    assert out_err(x, w, rtn(w * s, 4, 16, False).dequantize() / s) <= out_err(x, w, rtn(w, 4, 16, False).dequantize()) * (1 + 1e-6)


def test_awq_block_loss_chooses_for_the_block_not_for_the_largest_linear():
    """A block that reads only the second linear (as attention's output reads v, not q's scale):
    the search on the block's loss minimises that linear's error alone, never above s = 1, while
    the default sum of both linears' errors lets the 40x larger first one decide."""
    K = 128
    x = outlier_inputs(1024, K, seed=21)
    g = torch.Generator().manual_seed(22)
    big, small = torch.randn(64, K, generator=g) * 2.0, torch.randn(16, K, generator=g) * 0.05
    small[:, :8] *= 40  # the small linear's own weight outliers: another best s than big's
    seen = []

    def block(effective):
        seen.append(len(effective))
        return out_err(x, small, effective[1])

    def small_err(s):
        return out_err(x, small, rtn(small * s, 4, 32, False).dequantize() / s)

    s_block = search_scales(x, [big, small], 4, 32, loss=block)
    s_sum = search_scales(x, [big, small], 4, 32)
    assert set(seen) == {2} and len(seen) == 20  # every grid point, with both effective weights
    assert small_err(s_block) <= small_err(torch.ones(K)) * (1 + 1e-6)
    assert small_err(s_block) < small_err(s_sum)


def test_search_clip_never_raises_a_rows_error():
    """Inputs with a common mean: each group's clip lowers its own error, but the shrinkage it
    brings has one sign along the row, so the row's errors add up; a row whose whole output error
    would grow keeps its weights unclipped."""
    K = 128
    x = outlier_inputs(600, K, seed=31) + 3.0
    w = torch.randn(40, K, generator=torch.Generator().manual_seed(32))
    w[:, ::16] *= 6  # an outlier per half group: what tempts the clip

    def row_errors(v):
        d = w.double() - rtn(v, 4, 32, False).dequantize().double()
        return ((x.double() @ d.T) ** 2).sum(0)

    c = search_clip(x, w, 4, 32, sym=False)
    assert bool((row_errors(c) <= row_errors(w) * (1 + 1e-6)).all())
    assert not torch.equal(c, w)  # some rows still clip


@pytest.mark.parametrize("group_size", [16, -1])
def test_search_clip_never_raises_a_group_error(group_size):
    K = 64
    x = outlier_inputs(400, K, seed=13)
    w = torch.distributions.StudentT(2.0).sample((24, K))  # heavy tails: clipping pays somewhere
    wc = search_clip(x, w, 4, group_size)
    G = K if group_size == -1 else group_size
    assert wc.shape == w.shape and bool((wc.abs() <= w.abs()).all())

    def group_errors(wsrc):  # [N, ng] in float64, from the tokens
        d = (w - rtn(wsrc, 4, group_size, False).dequantize()).double()
        xg, dg = x.double().reshape(-1, K // G, G), d.reshape(-1, K // G, G)
        return (torch.einsum("tgi,ngi->tng", xg, dg) ** 2).sum(0)

    before, after = group_errors(w), group_errors(wc)
    assert bool((after <= before * (1 + 1e-5)).all())
    assert bool((after < 0.99 * before).any())
    iw = awq_quantize(wc, 4, group_size)
    assert torch.equal(iw.q, rtn(wc, 4, group_size, False).q)
