"""The choice of k (engine/speculative/goodput.py) and prompt lookup (ngram.py): pure Python, exact."""
from __future__ import annotations

import pytest

from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.speculative.goodput import Acceptance, StepCosts, choose_ks
from engine.speculative.ngram import NgramDrafter


def costs(table: dict[int, float]) -> StepCosts:
    c = StepCosts()
    for n, s in table.items():
        c.observe(n, s)
    return c


def test_step_costs_interpolate_and_extrapolate_pessimistically():
    c = costs({1: 0.010, 9: 0.018, 256: 0.5})
    assert c(1) == 0.010 and c(5) == pytest.approx(0.014)  # halfway between 1 and 9
    assert c(512) == pytest.approx(1.0)  # past the largest: proportional to n
    assert StepCosts()(4) == 0.0
    c.observe(1, 0.020)
    assert c(1) == pytest.approx(0.012)  # EWMA, weight 0.2


def test_no_drafts_when_verifying_costs_as_much_as_it_yields():
    """Compute-bound verification (T(n) = n·T(1)): E(k)/T(k+1) = (1 + α + … + α^k)/(k + 1) < 1."""
    linear = costs({n: 0.01 * n for n in range(1, 20)})
    assert choose_ks([0.9], [8], 1, linear, lambda b, d: 0.0) == [0]


def test_many_drafts_when_verifying_is_nearly_free_and_they_are_accepted():
    flat = costs({1: 0.010, 17: 0.0105})
    assert choose_ks([0.9], [8], 1, flat, lambda b, d: 0.0) == [8]
    assert choose_ks([0.9], [3], 1, flat, lambda b, d: 0.0) == [3]  # never past what is available
    assert choose_ks([0.0], [8], 1, flat, lambda b, d: 0.0) == [0]


def test_an_expensive_draft_model_shortens_k():
    flat = costs({1: 0.010, 17: 0.0105})
    free = choose_ks([0.8], [8], 1, flat, lambda b, d: 0.0)[0]
    dear = choose_ks([0.8], [8], 1, flat, lambda b, d: 0.004 * d)[0]
    assert 0 < dear < free
    # E(k) = (1 − 0.8^(k+1)) / 0.2 over ~0.010 + 0.004k: k = 1, 2, 3 give 129, 136, 134 tokens/s
    assert dear == 2


def test_the_batch_shares_the_cost():
    """Two chats: the one whose drafts are accepted gets them, the other none."""
    c = costs({2: 0.010, 6: 0.0104, 40: 0.03})
    assert choose_ks([0.9, 0.05], [4, 4], 2, c, lambda b, d: 0.0) == [4, 0]


def test_acceptance_starts_at_the_engine_wide_rate_and_follows_the_sequence():
    a = Acceptance(prior=0.5)
    assert a.of(1) == pytest.approx(0.5)
    for _ in range(20):
        a.observe(1, 4, 4)
    assert a.of(1) > 0.9 and a.rate > 0.9
    for _ in range(20):
        a.observe(2, 1, 0)
    assert a.of(2) < 0.3
    a.release(2)
    assert a.of(2) == pytest.approx(min(a.rate, 0.99))


def seq(tokens: list[int]) -> Sequence:
    return Sequence(tokens, SamplingParams(), seq_id=len(tokens))


def test_prompt_lookup_takes_the_longest_suffix_and_its_latest_occurrence():
    d = NgramDrafter(min_n=2, max_n=4)
    #        0  1  2  3  4  5  6  7  8  9  10 11
    s = seq([1, 2, 3, 9, 1, 2, 3, 8, 7, 2, 3])  # suffix (2, 3): latest earlier end 7 -> [8, 7, 2, 3]
    assert d.lookup(s, 4) == [8, 7, 2, 3]
    s = seq([5, 1, 2, 3, 6, 6, 1, 2, 3])  # suffix (1, 2, 3) matched at 1..3 -> 6, 6, ...
    assert d.lookup(s, 3) == [6, 6, 1]
    assert d.lookup(seq([1, 2, 3, 4]), 4) == []  # nothing repeats: no drafts
    assert d.lookup(seq([4, 4]), 4) == []  # the suffix itself is never its own match


def test_prompt_lookup_index_follows_appended_tokens():
    d = NgramDrafter(min_n=2, max_n=3)
    s = seq([1, 2, 3, 4])
    assert d.lookup(s, 2) == []
    s.token_ids += [1, 2]
    assert d.lookup(s, 2) == [3, 4]
    s.token_ids += [3, 5, 1, 2]
    assert d.lookup(s, 2) == [3, 5]  # the latest occurrence of (1, 2) wins now
