"""Sampler: greedy, truncation masks, penalties, seeds, distribution, logprobs.

The references here are written the slow, obvious way (float64, full sort) so that the sampler's
candidate-window shortcuts are checked against the definition.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sampling.sampler import _RACE_HEAD, REPETITION_WINDOW, Sampler, apply_penalties, truncate
from engine.sampling_params import SamplingParams as SP


@pytest.fixture(autouse=True)
def _one_thread():
    """These tensors are tiny: extra intra-op threads only add sync cost on a busy 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run(logits, params, gens=None, hists=None, nprompt=None, sampler=None):
    n = logits.shape[0]
    return (sampler or Sampler(seed=0))(
        logits, params, gens or [None] * n, hists or [[] for _ in range(n)], nprompt or [0] * n)


def reference_keep(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> set[int]:
    """Kept token ids by the textbook definitions, in float64 over the whole sorted vocab."""
    l = logits.double()
    order = torch.argsort(l, descending=True, stable=True).tolist()
    keep = order[:top_k] if 0 < top_k < len(order) else order
    if top_p < 1.0:
        p = torch.softmax(l[keep], 0).tolist()
        acc, kept = 0.0, []
        for tok, pi in zip(keep, p):
            kept.append(tok)
            acc += pi
            if acc >= top_p:
                break
        keep = kept
    if min_p > 0.0:
        probs = torch.softmax(l, 0)
        keep = [t for t in keep if probs[t] >= min_p * probs.max()]
    return set(keep)


def test_greedy_is_argmax_per_row_even_next_to_random_rows():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 300, generator=g)
    params = [SP(temperature=0.0), SP(temperature=1.0), SP(temperature=0.0, top_k=5),
              SP(temperature=0.0, top_p=0.5), SP(temperature=0.8), SP(temperature=0.0)]
    out = run(logits, params)
    for r, p in enumerate(params):
        if p.is_greedy:
            assert out.token_ids[r] == int(logits[r].argmax())


@pytest.mark.parametrize("top_k,top_p,min_p", [
    (0, 1.0, 0.0), (1, 1.0, 0.0), (5, 1.0, 0.0), (0, 0.5, 0.0), (0, 0.9, 0.0), (10, 0.8, 0.0),
    (0, 1.0, 0.1), (0, 1.0, 0.5), (7, 0.95, 0.05), (0, 0.3, 0.2), (100, 0.99, 0.0), (0, 1e-6, 0.0),
])
def test_truncation_keeps_exactly_the_reference_set(top_k, top_p, min_p):
    g = torch.Generator().manual_seed(top_k * 1000 + int(top_p * 100) + int(min_p * 10))
    for scale in (0.3, 1.0, 4.0):
        logits = torch.randn(64, generator=g) * scale
        vals, ids = truncate(logits, top_k, top_p, min_p)
        kept = set(range(64)) if ids is None else set(ids.tolist())
        assert kept == reference_keep(logits, top_k, top_p, min_p)
        ids_t = torch.arange(64) if ids is None else ids
        assert torch.equal(vals, logits[ids_t])


row_params = st.builds(
    SP, temperature=st.sampled_from([0.0, 0.3, 1.0, 2.5]), top_k=st.sampled_from([0, 1, 3, 50, 400]),
    top_p=st.sampled_from([1.0, 0.99, 0.8, 0.3, 0.01]), min_p=st.sampled_from([0.0, 0.02, 0.3]))


@settings(max_examples=60, deadline=None)
@given(params=st.lists(row_params, min_size=1, max_size=6), V=st.sampled_from([7, 300, 2000]),
       scale=st.sampled_from([0.1, 1.0, 6.0]), seed=st.integers(0, 2**31))
def test_batched_draws_stay_in_each_rows_reference_set(params, V, scale, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(params), V, generator=g) * scale
    out = run(logits, params, gens=[torch.Generator().manual_seed(seed + r) for r in range(len(params))])
    for r, p in enumerate(params):
        if p.is_greedy:
            assert out.token_ids[r] == int(logits[r].argmax())
        else:
            assert out.token_ids[r] in reference_keep(logits[r] / p.temperature, p.top_k, p.top_p, p.min_p)


def test_top_p_window_widens_on_flat_distributions():
    # 20k nearly equal logits: top_p=0.9 needs ~18k tokens, far past the first window.
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(20000, generator=g) * 0.01
    _, ids = truncate(logits, 0, 0.9, 0.0)
    assert set(ids.tolist()) == reference_keep(logits, 0, 0.9, 0.0)


def test_repetition_penalty_divides_positive_and_multiplies_negative_in_window():
    logits = torch.tensor([[2.0, -2.0, 0.5, 1.0, 3.0]])
    # token 4 is seen only before the 64-token window, so it is not penalized
    hist = [4] + [0] * REPETITION_WINDOW + [1, 2]
    out = apply_penalties(logits.clone(), [SP(repetition_penalty=2.0)], [hist], [len(hist)])
    assert torch.allclose(out, torch.tensor([[1.0, -4.0, 0.25, 1.0, 3.0]]))


def test_frequency_and_presence_penalties_count_output_tokens_only():
    logits = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    hist = [0, 0, 1, 2, 2, 2]  # prompt [0, 0, 1]; output [2, 2, 2]
    p = SP(frequency_penalty=0.5, presence_penalty=0.25)
    out = apply_penalties(logits.clone(), [p], [hist], [3])
    assert torch.allclose(out, torch.tensor([[1.0, 1.0, 1.0 - 3 * 0.5 - 0.25, 1.0]]))


def test_penalties_apply_per_row_and_leave_other_rows_alone():
    logits = torch.ones(3, 4)
    params = [SP(repetition_penalty=2.0), SP(), SP(presence_penalty=1.0)]
    hists = [[3], [3], [0, 1]]
    out = apply_penalties(logits.clone(), params, hists, [1, 1, 1])
    assert out.tolist() == [[1, 1, 1, 0.5], [1, 1, 1, 1], [1, 0, 1, 1]]


def test_penalties_change_greedy_choice():
    logits = torch.tensor([[5.0, 4.0, 0.0]])
    out = run(logits, [SP(temperature=0.0, repetition_penalty=1.5)], hists=[[0]], nprompt=[1])
    assert out.token_ids == [1]  # 5/1.5 < 4


def seq_tokens(seed, steps=20, batch_noise=False):
    """Tokens of one seeded row over `steps` steps, alone or next to two unseeded rows."""
    g, other = torch.Generator().manual_seed(1234), torch.Generator().manual_seed(99)
    gen = torch.Generator().manual_seed(seed)
    sampler = Sampler()
    toks = []
    for _ in range(steps):
        logits = torch.randn(1, 500, generator=g)
        params, gens = [SP(temperature=1.0, top_p=0.95)], [gen]
        if batch_noise:
            logits = torch.cat([logits, torch.randn(2, 500, generator=other)])
            params, gens = params + [SP(temperature=1.0)] * 2, gens + [None] * 2
        n = logits.shape[0]
        toks.append(sampler(logits, params, gens, [[]] * n, [0] * n).token_ids[0])
    return toks


def test_same_seed_same_tokens_regardless_of_batch_neighbours():
    assert seq_tokens(7) == seq_tokens(7)
    assert seq_tokens(7) == seq_tokens(7, batch_noise=True)
    assert seq_tokens(7) != seq_tokens(8)


def frequencies(logits_row, params, n=20000, seed=0, chunk=2000):
    """Empirical distribution of n draws (batches of identical rows)."""
    sampler, V = Sampler(seed=seed), logits_row.shape[0]
    counts = torch.zeros(V, dtype=torch.float64)
    for _ in range(n // chunk):
        out = run(logits_row.expand(chunk, -1).contiguous(), [params] * chunk, sampler=sampler)
        counts += torch.bincount(torch.tensor(out.token_ids), minlength=V).double()
    return counts / n


def assert_close_to(freq, probs, n):
    """Every bin within 5 binomial standard deviations (deterministic: fixed seeds)."""
    sd = torch.sqrt(probs * (1 - probs) / n) + 1e-12
    z = ((freq - probs).abs() / sd)[probs > 0]
    assert float(z.max()) < 5.0, z
    assert float(freq[probs == 0].sum()) == 0.0


def test_samples_follow_tempered_softmax():
    logits = torch.tensor([1.0, 2.0, 0.5, -1.0, 1.5, 0.0])
    freq = frequencies(logits, SP(temperature=0.7))
    assert_close_to(freq, torch.softmax(logits.double() / 0.7, 0), 20000)


def test_samples_follow_truncated_renormalized_softmax():
    logits = torch.tensor([1.0, 2.0, 0.5, -1.0, 1.5, 0.0, 0.2, -0.3])
    p = SP(temperature=1.3, top_k=5, top_p=0.8)
    keep = reference_keep(logits / 1.3, 5, 0.8, 0.0)
    probs = torch.softmax(logits.double() / 1.3, 0)
    mask = torch.zeros(8, dtype=torch.bool)
    mask[list(keep)] = True
    probs = torch.where(mask, probs, 0.0)
    assert_close_to(frequencies(logits, p), probs / probs.sum(), 20000)


@pytest.mark.parametrize("min_p", [0.0, 0.05])
def test_two_stage_race_over_a_large_vocab_is_exact(min_p):
    # No top-k/top-p: the race picks the window (top _RACE_HEAD) or the tail, then races inside.
    g = torch.Generator().manual_seed(5)
    V = 800
    logits = torch.randn(V, generator=g) * 0.5
    logits[:3] = torch.tensor([1.5, 1.3, 1.2])
    n = 6000
    freq = frequencies(logits, SP(temperature=1.0, min_p=min_p), n=n, seed=1)
    keep = torch.tensor(sorted(reference_keep(logits, 0, 1.0, min_p)))
    probs = torch.zeros(V, dtype=torch.float64)
    probs[keep] = torch.softmax(logits.double()[keep], 0)
    tail = torch.ones(V, dtype=torch.bool)
    tail[torch.topk(logits, _RACE_HEAD).indices] = False
    assert float(probs[tail].sum()) > 0.02  # the tail stage really runs
    assert_close_to(freq[:3], probs[:3], n)
    assert_close_to(freq[tail].sum(0, keepdim=True), probs[tail].sum(0, keepdim=True), n)
    assert float(freq[probs == 0].sum()) == 0.0


def test_top_p_beyond_the_window_falls_back_and_stays_in_the_nucleus():
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(4000, generator=g) * 0.05
    keep = reference_keep(logits, 0, 0.5, 0.0)
    assert len(keep) > 256
    out = run(logits.expand(50, -1).contiguous(), [SP(top_p=0.5)] * 50)
    assert set(out.token_ids) <= keep and len(set(out.token_ids)) > 30


def test_tokens_do_not_depend_on_neighbours_windows():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(1, 3000, generator=g)
    mine = SP(temperature=0.9, top_k=20)
    alone = run(logits, [mine], gens=[torch.Generator().manual_seed(4)])
    crowd = run(torch.cat([logits, torch.randn(3, 3000, generator=g)]),
                [mine, SP(top_k=500), SP(), SP(top_p=0.9)],
                gens=[torch.Generator().manual_seed(4), None, None, None])
    assert alone.token_ids[0] == crowd.token_ids[0]


def test_logprobs_are_log_softmax_after_penalties_before_temperature():
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(2, 50, generator=g)
    params = [SP(temperature=0.0, logprobs=3, repetition_penalty=1.3),
              SP(temperature=2.0, top_k=2, logprobs=0)]
    hists = [[0, 1, 2], []]
    out = run(logits, params, hists=hists, nprompt=[3, 0])
    ref = apply_penalties(logits.clone().double(), params, hists, [3, 0]).log_softmax(-1)
    for r in range(2):
        lp = out.logprobs[r]
        assert lp.token_id == out.token_ids[r]
        assert math.isclose(lp.logprob, float(ref[r, lp.token_id]), abs_tol=1e-5)
    top = out.logprobs[0].top
    assert [t for t, _ in top] == torch.topk(ref[0], 3).indices.tolist()
    assert all(math.isclose(v, float(ref[0, t]), abs_tol=1e-5) for t, v in top)
    assert out.logprobs[1].top == []


def test_rows_without_logprobs_get_none_and_empty_batch_is_fine():
    out = run(torch.randn(2, 10), [SP(temperature=0.0), SP(temperature=0.0, logprobs=1)])
    assert out.logprobs[0] is None and out.logprobs[1] is not None
    assert run(torch.empty(0, 10), []).token_ids == []


def test_tiny_temperature_and_top_k_1_pick_the_argmax():
    g = torch.Generator().manual_seed(9)
    logits = torch.randn(8, 1000, generator=g) * 5
    out = run(logits, [SP(temperature=1e-4)] * 4 + [SP(temperature=2.0, top_k=1)] * 4)
    assert out.token_ids == logits.argmax(-1).tolist()


def test_mismatched_inputs_are_a_clear_error():
    with pytest.raises(ValueError, match="one SamplingParams"):
        Sampler()(torch.randn(2, 10), [SP()], [None], [[]], [0])


def test_does_not_modify_the_callers_logits():
    logits = torch.randn(1, 10)
    before = logits.clone()
    run(logits, [SP(repetition_penalty=2.0, temperature=0.0)], hists=[[1, 2, 3]], nprompt=[3])
    assert torch.equal(logits, before)


@pytest.mark.parametrize("params", [SP(temperature=1.0, top_p=0.95), SP(temperature=1.0, top_k=40), SP(temperature=1.0)])
def test_a_seeded_draw_does_not_follow_the_order_of_near_equal_tokens(params):
    """Forty tokens tie but for a last-bit nudge, ascending in one run and descending in the
    other (as another CPU path or machine rounds them): the sort orders them oppositely, and
    the same seed must still draw the same token, since noise belongs to a token id, not to a
    rank (race_noise.py). Handed out by rank, nearly every draw among them would move."""
    V, tied = 2000, 40
    base = torch.zeros(V)
    base[:tied] = 5.0
    nudge = torch.arange(tied, dtype=torch.float32) * 1e-6
    up, down = base.clone(), base.clone()
    up[:tied] += nudge
    down[:tied] += nudge.flip(0)
    n = 64
    draws = [run(x.expand(n, -1).contiguous(), [params] * n,
                 gens=[torch.Generator().manual_seed(s) for s in range(n)]).token_ids for x in (up, down)]
    assert sum(t < tied for t in draws[0]) > n // 2  # the tied tokens hold most of the mass
    assert draws[0] == draws[1]
