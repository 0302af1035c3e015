"""The C++ paged-attention decode kernel (engine/kernels/csrc/paged_attention.cpp) on every code
path this CPU has: against a float64 reference and torch's SDPA, bitwise batch invariance, and
the engine's paged_attention with the kernel against its gather + SDPA fallback.

Tolerance. The kernel works in float32. A score x = scale q.k is a sum of D rounded products, so
it is off by about eps32 |x|, and e^(x - m) by another eps32; the weights inherit that as a
relative error, and the output, a convex combination of V rows, moves by about
eps32 (1 + max|x|) max|v|. The tests allow twice that: measured errors are 10-100x below it
(float32 SDPA's are the same size), and it is still ~4 orders of magnitude below one bf16
rounding, which a wrong row, a lost tile or a bad rescale would show as. For bf16/fp16 pools the
reference reads the same 16-bit values upcast exactly, so the tolerance stays float32's.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import CpuPath, available_paths, kernels
from engine.kernels.attention import decode_kernel_available, paged_decode
from engine.layers import attention as attn
from engine.layers.attention import AttentionMetadata, paged_attention

pytestmark = pytest.mark.skipif(kernels() is None or not hasattr(kernels(), "paged_attention_decode"),
                                reason="Ember's CPU kernels are not built (python -m engine.kernels.build)")

PATHS = available_paths() if kernels() is not None else []
B = 16
EPS32 = torch.finfo(torch.float32).eps


def make_case(seq_lens: list[int], H: int, n_kv: int, hd: int, dtype: torch.dtype, seed: int = 0):
    """Pools with shuffled, non-contiguous block ids per sequence and tables padded with junk ids."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // B) for n in seq_lens]
    num_blocks = 2 * sum(need) + 3
    k_cache = torch.randn(num_blocks, B, n_kv, hd, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, B, n_kv, hd, generator=g).to(dtype)
    ids = torch.randperm(num_blocks, generator=g)
    width = max(need) + 2
    tables = torch.randint(0, num_blocks, (len(seq_lens), width), generator=g)  # padding: any id
    used = 0
    for i, nb in enumerate(need):
        tables[i, :nb] = ids[used:used + nb]
        used += nb
    q = torch.randn(len(seq_lens), H, hd, generator=g)
    return q, k_cache, v_cache, tables, torch.tensor(seq_lens, dtype=torch.long)


def context(cache: torch.Tensor, table: torch.Tensor, n: int) -> torch.Tensor:
    """[n, n_kv, hd] rows of one sequence, read block by block the slow, obvious way."""
    return torch.cat([cache[int(b)] for b in table[:-(-n // B)]])[:n]


def reference(q, k_cache, v_cache, tables, seq_lens, scale, window: int = 0) -> tuple[torch.Tensor, float]:
    """float64 softmax(q K^T scale) V per sequence and head, from the pools' exact values (with a
    window: over the last `window` keys only); and max |x|."""
    S, H, hd = q.shape
    G = H // k_cache.shape[2]
    out = torch.empty(S, H, hd, dtype=torch.float64)
    xmax = 0.0
    for s in range(S):
        n = int(seq_lens[s])
        k = context(k_cache, tables[s], n).double()
        v = context(v_cache, tables[s], n).double()
        if window:
            k, v = k[-window:], v[-window:]
        for h in range(H):
            x = k[:, h // G] @ q[s, h].double() * scale
            xmax = max(xmax, x.abs().max().item())
            out[s, h] = torch.softmax(x, dim=0) @ v[:, h // G]
    return out, xmax


def sdpa(q, k_cache, v_cache, tables, seq_lens, scale) -> torch.Tensor:
    """float32 SDPA per sequence over the same (upcast) rows."""
    out = torch.empty_like(q)
    for s in range(q.shape[0]):
        n = int(seq_lens[s])
        k = context(k_cache, tables[s], n).float().transpose(0, 1)
        v = context(v_cache, tables[s], n).float().transpose(0, 1)
        out[s] = F.scaled_dot_product_attention(q[s][:, None], k, v, scale=scale, enable_gqa=True)[:, 0]
    return out


def tolerance(xmax: float, v_cache: torch.Tensor) -> float:
    return 2 * EPS32 * (1 + xmax) * v_cache.float().abs().max().item()


LENS = [1, B - 1, B, B + 1, 2 * B, 63, 64, 65, 300]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("H,n_kv,hd", [(4, 4, 64), (9, 3, 64), (12, 3, 128), (8, 2, 128), (4, 1, 32), (6, 2, 16)])
def test_matches_reference_and_sdpa(path, dtype, H, n_kv, hd):
    q, k_cache, v_cache, tables, seq_lens = make_case(LENS, H, n_kv, hd, dtype, seed=hd + H)
    scale = hd ** -0.5
    got = paged_decode(q, k_cache, v_cache, tables, seq_lens, scale, path)
    assert got.dtype == torch.float32 and got.shape == q.shape
    ref, xmax = reference(q, k_cache, v_cache, tables, seq_lens, scale)
    tol = tolerance(xmax, v_cache)
    err = (got.double() - ref).abs().max().item()
    assert err <= tol, f"max error {err:.3g} > {tol:.3g}"
    err_sdpa = (got - sdpa(q, k_cache, v_cache, tables, seq_lens, scale)).abs().max().item()
    assert err_sdpa <= 2 * tol, f"max difference from SDPA {err_sdpa:.3g} > {2 * tol:.3g}"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_large_scores_and_long_context(path):
    """Peaked softmax (scale 1, |x| in the tens): the running max must rescale without overflow."""
    q, k_cache, v_cache, tables, seq_lens = make_case([1000, 2049], 6, 2, 64, torch.float32, seed=7)
    q = q * 3
    got = paged_decode(q, k_cache, v_cache, tables, seq_lens, 1.0, path)
    ref, xmax = reference(q, k_cache, v_cache, tables, seq_lens, 1.0)
    assert torch.isfinite(got).all() and xmax > 50
    err = (got.double() - ref).abs().max().item()
    assert err <= tolerance(xmax, v_cache), err


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
@pytest.mark.parametrize("window", [1, B - 1, B, 33, 512])
def test_a_sliding_window_reads_only_the_last_window_keys(path, window):
    """Gemma 3's local layers: every sequence attends to its last `window` keys (all of them
    when shorter), whatever block the window starts in."""
    q, k_cache, v_cache, tables, seq_lens = make_case(LENS + [700], 4, 1, 64, torch.float32, seed=window)
    got = paged_decode(q, k_cache, v_cache, tables, seq_lens, 0.125, path, window=window)
    ref, xmax = reference(q, k_cache, v_cache, tables, seq_lens, 0.125, window)
    err = (got.double() - ref).abs().max().item()
    assert err <= tolerance(xmax, v_cache), err
    if window < max(LENS):  # and it is not the full-context answer
        assert not torch.allclose(got, paged_decode(q, k_cache, v_cache, tables, seq_lens, 0.125, path))


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_batch_invariance(path, dtype):
    """A sequence's output has the same bits alone and in batches of 8 and 17, at any index."""
    lens = [37, 1, 300, 16, 17, 250, 64, 5, 129, 2, 48, 90, 15, 31, 200, 3, 77]
    q, k_cache, v_cache, tables, seq_lens = make_case(lens, 9, 3, 64, dtype, seed=3)
    full = paged_decode(q, k_cache, v_cache, tables, seq_lens, 0.125, path)
    part = paged_decode(q[5:13], k_cache, v_cache, tables[5:13], seq_lens[5:13], 0.125, path)
    assert torch.equal(part, full[5:13])
    for i in (0, 2, 7, 16):
        alone = paged_decode(q[i:i + 1], k_cache, v_cache, tables[i:i + 1, :-(-lens[i] // B)], seq_lens[i:i + 1],
                             0.125, path)
        assert torch.equal(alone[0], full[i]), i
    threads = torch.get_num_threads()  # and with another split of the tasks among threads
    torch.set_num_threads(1)
    try:
        assert torch.equal(paged_decode(q, k_cache, v_cache, tables, seq_lens, 0.125, path), full)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, "q8_0"], ids=str)
@pytest.mark.parametrize("window", [0, 40, 400])
def test_rows_of_one_sequence_share_tasks_and_keep_each_rows_bits(path, dtype, window):
    """A sequence's consecutive rows (a prompt chunk, or a decode and its drafts) read the same
    blocks, so the kernel runs them as one task per KV head; each row's output must have the
    bits it has alone, whatever the run's length or the threads, with tile and window edges
    inside the run (rows at 60..69 cross 64; a window of 40 is full for some and not others)."""
    lens = [70]
    q1, k_cache, v_cache, tables, _ = make_case(lens, 9, 3, 64, torch.float32 if dtype == "q8_0" else dtype, seed=5)
    if dtype == "q8_0":
        k_cache, v_cache = kernels().kv_q8(k_cache), kernels().kv_q8(v_cache)
    g = torch.Generator().manual_seed(6)
    for first, rows in ((1, 5), (30, 20), (60, 10), (3, 40)):
        seq_lens = torch.arange(first, first + rows, dtype=torch.long)
        q = torch.randn(rows, 9, 64, generator=g)
        run = paged_decode(q, k_cache, v_cache, tables.expand(rows, -1), seq_lens, 0.125, path, window=window)
        for i in range(rows):
            alone = paged_decode(q[i:i + 1], k_cache, v_cache, tables[:1], seq_lens[i:i + 1], 0.125, path,
                                 window=window)
            assert torch.equal(alone[0], run[i]), (first, rows, i)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            one = paged_decode(q, k_cache, v_cache, tables.expand(rows, -1), seq_lens, 0.125, path, window=window)
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(one, run)


def test_bad_inputs_are_refused():
    q, k_cache, v_cache, tables, seq_lens = make_case([20, 40], 4, 2, 64, torch.float32)
    op = kernels().paged_attention_decode
    with pytest.raises(RuntimeError, match="not a block of the pool"):
        bad = tables.clone()
        bad[1, 0] = k_cache.shape[0]
        op(q, k_cache, v_cache, bad, seq_lens, 0.125, 0)
    with pytest.raises(RuntimeError, match="outside"):
        op(q, k_cache, v_cache, tables, torch.tensor([0, 40]), 0.125, 0)
    with pytest.raises(RuntimeError, match="multiple of num_kv_heads"):
        op(torch.randn(2, 3, 64), k_cache, v_cache, tables, seq_lens, 0.125, 0)
    with pytest.raises(RuntimeError, match="float32"):
        op(q.double(), k_cache, v_cache, tables, seq_lens, 0.125, 0)
    with pytest.raises(RuntimeError, match="not supported"):
        op(q, k_cache.double(), v_cache.double(), tables, seq_lens, 0.125, 0)
    with pytest.raises(RuntimeError, match="does not exist"):
        op(q, k_cache, v_cache, tables, seq_lens, 0.125, 7)
    for path in set(CpuPath) - set(PATHS) - {CpuPath.NONE}:  # a path this CPU lacks a feature of
        with pytest.raises(RuntimeError, match="lacks"):
            op(q, k_cache, v_cache, tables, seq_lens, 0.125, int(path))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_engine_path_matches_fallback(dtype, monkeypatch):
    """paged_attention on a mixed step (3 decodes, then 2 prefill chunks): the kernel's decode
    rows agree with gather + SDPA's, and the prefill rows are untouched by the switch."""
    H, n_kv, hd = 6, 2, 64
    ctx = [40, 1, 130, 24, 50]  # context before this step
    new = [1, 1, 1, 24, 10]     # decodes, a fresh prefill, a prefill chunk after a cached prefix
    lens = [c + n for c, n in zip(ctx, new)]
    _, k_cache, v_cache, tables, _ = make_case(lens, H, n_kv, hd, dtype, seed=11)
    g = torch.Generator().manual_seed(12)
    T = sum(new)
    q, k, v = (torch.randn(T, h, hd, generator=g).to(dtype) for h in (H, n_kv, n_kv))
    slots = [int(tables[i, p // B]) * B + p % B for i in range(5) for p in range(ctx[i], lens[i])]
    starts = [0]
    for n in new:
        starts.append(starts[-1] + n)

    def meta() -> AttentionMetadata:
        return AttentionMetadata(slot_mapping=torch.tensor(slots), query_start_loc=starts, seq_lens=lens,
                                 block_tables=tables, num_decodes=3)

    assert decode_kernel_available(k_cache)
    got = paged_attention(q, k, v, k_cache.clone(), v_cache.clone(), meta(), hd ** -0.5)
    monkeypatch.setattr(attn, "decode_kernel_available", lambda cache: False)
    want = paged_attention(q, k, v, k_cache.clone(), v_cache.clone(), meta(), hd ** -0.5)
    assert got.dtype == dtype and got.shape == want.shape
    assert torch.equal(got[3:], want[3:])
    # The fallback runs SDPA in the cache dtype (q rounded to it); the kernel keeps q and the
    # sums in float32: for bf16 they differ by bf16 roundings, not by float32 ones.
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got[:3].float(), want[:3].float(), rtol=0, atol=tol)
