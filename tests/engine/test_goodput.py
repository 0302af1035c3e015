"""The choice of k (engine/speculative/goodput.py) and prompt lookup (ngram.py): pure Python, exact."""
from __future__ import annotations

import pytest

from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.speculative.goodput import Acceptance, StepCostModel, choose_ks
from engine.speculative.ngram import NgramDrafter


def test_the_cost_model_recovers_a_linear_step_time():
    """T = 5 ms + 0.2 ms a token + 0.5 ms per 1024 keys + 1 ms for several rows, recovered exactly."""
    m = StepCostModel(forget=1.0, ridge=1e-12)
    truth = lambda n, keys: 0.005 + 0.0002 * n + 0.0005 * keys / 1024 + 0.001 * (n > 1)
    for n, keys in [(1, 100), (1, 3000), (2, 500), (5, 900), (9, 20000), (17, 4000), (3, 100)]:
        m.observe(n, keys, truth(n, keys))
    for n, keys in [(1, 50), (4, 10000), (30, 1234)]:
        assert m(n, keys) == pytest.approx(truth(n, keys), rel=1e-6)
    assert StepCostModel()(4, 100) == 0.0  # nothing measured: no cost known


def test_prompt_chunks_do_not_set_the_cost_of_a_draft_row():
    """Three turns of a chat: a prompt in chunks of 256 and 96 tokens (compute-bound, 3.9 ms a
    token), then decodes and verify steps of 2-4 rows, T = 25 ms + 1.25 ms a row past the first +
    0.5 ms per 1024 keys. A line through the chunks too put a second row below nothing."""
    m = StepCostModel()
    truth = lambda n, keys: 0.025 + 0.00125 * (n - 1) + 0.0005 * keys / 1024
    L = 0
    for turn in range(3):
        for n in (256, 96):
            m.observe(n, n * L + n * (n + 1) // 2, 0.0039 * n * (1 + L / 4000))
            L += n
        for i in range(60):
            n = 2 + i % 3
            m.observe(1, L, truth(1, L))
            m.observe(n, n * L + n * (n + 1) // 2, truth(n, n * L + n * (n + 1) // 2))
            L += n
    extra = m(2, 2 * L + 3) - m(1, L)
    assert extra == pytest.approx(truth(2, 2 * L + 3) - truth(1, L), abs=3e-4)


def test_recent_steps_weigh_most():
    m = StepCostModel(forget=0.5)
    for _ in range(20):
        m.observe(1, 100, 0.010)
    for _ in range(20):
        m.observe(1, 100, 0.020)
    assert m(1, 100) == pytest.approx(0.020, rel=1e-3)


def flat(n, keys):  # memory-bound: drafts nearly free
    return 0.010 + 0.00003 * n


def test_no_drafts_when_verifying_costs_as_much_as_it_yields():
    """Compute-bound verification (T(n) = n·T(1)): E(k)/T(k+1) = (1 + α + … + α^k)/(k + 1) < 1."""
    assert choose_ks([0.9], [8], [100], lambda n, keys: 0.01 * (1 + n), lambda b, d: 0.0) == [0]


def test_many_drafts_when_verifying_is_nearly_free_and_they_are_accepted():
    assert choose_ks([0.9], [8], [100], flat, lambda b, d: 0.0) == [8]
    assert choose_ks([0.9], [3], [100], flat, lambda b, d: 0.0) == [3]  # never past what is available
    assert choose_ks([0.0], [8], [100], flat, lambda b, d: 0.0) == [0]


def test_an_expensive_draft_model_shortens_k():
    free = choose_ks([0.8], [8], [100], flat, lambda b, d: 0.0)[0]
    dear = choose_ks([0.8], [8], [100], flat, lambda b, d: 0.004 * d)[0]
    assert 0 < dear < free
    # E(k) = (1 − 0.8^(k+1)) / 0.2 over ~0.010 + 0.004k: k = 1, 2, 3 give 129, 136, 134 tokens/s
    assert dear == 2


def test_drafts_on_long_contexts_cost_their_attention():
    """The same acceptance, attention 1 ms per 1024 keys: a 512-token chat drafts, a 16k one does not."""
    cost = lambda n, keys: 0.010 + 0.00003 * n + 0.001 * keys / 1024
    assert choose_ks([0.5], [4], [512], cost, lambda b, d: 0.0)[0] > 0
    assert choose_ks([0.5], [4], [16384], cost, lambda b, d: 0.0) == [0]


def test_the_batch_shares_the_cost():
    """Two chats, a draft costing 10% of a step: the one whose drafts are accepted gets them, the
    other none (its first would add 0.05 tokens for 0.001 s: 5.15/0.015 < 5.1/0.014 tokens/s)."""
    cost = lambda n, keys: 0.010 + 0.001 * n
    assert choose_ks([0.9, 0.05], [4, 4], [100, 100], cost, lambda b, d: 0.0) == [4, 0]


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

