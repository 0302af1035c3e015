"""Speculation that is never slower: the guard (engine/speculative/guard.py) holds drafting back
when the steps that verify drafts deliver fewer tokens per second than plain steps, whatever the
fitted cost model says, and lets it back when drafts pay again; the fit itself never prices a
token, a key or a second row below nothing.

The runner here is the test's own clock: a loop of 4 decoding sequences whose step time and
acceptance the test sets, phase by phase, through the Speculator's real hooks (observe_step,
after_step, draft), with the cost model made to believe drafts are free.
"""
from __future__ import annotations

from engine.sampling_params import SamplingParams
from engine.scheduler_output import SchedulerOutput
from engine.sequence import Sequence
from engine.speculative.drafter import Draft
from engine.speculative.goodput import StepCostModel
from engine.speculative.guard import DraftGuard
from engine.speculative.speculator import Speculator


class _AlwaysDrafter:
    """Free, always able to propose; the next token of the script is what the test decides."""

    name, shadow = "test", False

    def available(self, seqs, max_k):
        return [max_k] * len(seqs)

    def propose(self, seqs, ks):
        return [Draft([7] * k) for k in ks]

    def cost(self, num_seqs, depth):
        return 0.0

    def release(self, seq):
        pass

    def close(self):
        pass


class _FreeDrafts:
    """A cost model that has learnt nothing true: every step costs the same, drafts or not."""

    def observe(self, n, attended, seconds):
        pass

    def __call__(self, n, attended):
        return 0.001


def _run(spec: Speculator, seqs: list[Sequence], steps: int, seconds, accepted: int) -> list[int]:
    """`steps` decode steps; seconds(total drafts) is the step's time, each drafted sequence keeps
    `accepted` of its drafts. Returns the drafts verified per step."""
    verified = []
    for _ in range(steps):
        d = [len(s.spec_token_ids) for s in seqs]
        out = SchedulerOutput(list(seqs), [1 + k for k in d], sum(k == 0 for k in d), num_spec_tokens=d)
        spec.observe_step(out, seconds(sum(d)))
        tokens = [[7] * min(accepted, k) + [8] for k in d]
        for s, k, new in zip(seqs, d, tokens):  # the scheduler's postprocess, for these decodes
            s.num_computed_tokens += 1 + len(new) - 1
            s.token_ids.extend(new)
            s.clear_spec()
        spec.after_step(out, tokens, seqs)
        verified.append(sum(d))
    return verified


def test_drafting_stops_when_it_does_not_pay_and_comes_back_when_it_does():
    spec = Speculator(_AlwaysDrafter(), max_k=4)
    spec.costs = _FreeDrafts()  # a wrong fit: any number of drafts looks free
    seqs = [Sequence([1, 2, 3], SamplingParams(max_tokens=10_000)) for _ in range(4)]
    for s in seqs:
        s.num_computed_tokens = s.num_tokens - 1
    slow = lambda drafts: 0.010 + 0.004 * drafts  # noqa: E731 - each draft row costs 40% of a step...
    verified = _run(spec, seqs, 200, slow, accepted=0)  # ...and none is accepted
    assert sum(verified[:8]) > 0  # the wrong fit drafted at first
    tail = verified[100:]
    assert sum(v > 0 for v in tail) <= len(tail) // spec.guard.explore_every + 1  # only the probes
    assert spec.stats.num_held_back > 0
    plain, drafted = spec.guard.rates(4)
    assert drafted < plain
    cheap = lambda drafts: 0.010 + 0.0002 * drafts  # noqa: E731 - drafts nearly free and all accepted
    verified = _run(spec, seqs, 200, cheap, accepted=4)
    assert sum(v > 0 for v in verified[100:]) >= 0.8 * 100  # drafting again on most steps
    plain, drafted = spec.guard.rates(4)
    assert drafted > plain


def test_the_guard_learns_both_kinds_before_it_judges():
    g = DraftGuard(explore_every=8, min_samples=3)
    assert g.pays(2) is None
    decisions = [g.allow(2) for _ in range(16)]
    assert not all(decisions) and any(decisions)  # plain steps mixed in while learning
    for _ in range(3):
        g.observe(2, drafted=True, tokens=2, seconds=1.0)
        g.observe(2, drafted=False, tokens=2, seconds=0.5)
    assert g.pays(2) is False and g.pays(3) is None  # per batch size
    allowed = [g.allow(2) for _ in range(64)]
    assert sum(allowed) == 64 // 8  # held back, but for one exploring step in 8


def test_the_fitted_step_cost_has_no_negative_term():
    m = StepCostModel()
    for _ in range(30):  # a single row slower than several (a path switch): the free fit's e < 0
        m.observe(1, 100, 0.010)
        m.observe(4, 400, 0.008)
        m.observe(8, 800, 0.009)
    a, b, c, e = m.coef
    assert min(b, c, e) >= 0.0 and a > 0
    assert m(8, 800) >= m(4, 400) >= 0.0  # more rows never cost less
