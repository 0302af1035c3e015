"""Speculative decoding (engine/speculative/): greedy output is plain greedy output token for token,
sampled output has the target's distribution, a rejection leaves the KV as a fresh prefill would.

Greedy exactness runs on the bundled model on Ember's kernels, which compute every row of a step
on its own (the same bits whatever the batch: tests/kernels/test_qlinear.py), so "identical" is the bar,
not "identical up to near-ties". The distribution tests use seeded requests and a chi-square
p-value floor of 1e-3: deterministic, and a wrong sampler fails them by orders of magnitude.
"""
from __future__ import annotations

import random

import pytest
import torch

from engine.config import EngineConfig
from engine.kernel_library import kernels_installed
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.speculative.drafter import Draft
from engine.speculative.speculator import Speculator
from engine.sampling.verify import rejection_sample

CODE = ("def squares(xs):\n    out = []\n    for x in xs:\n        out.append(x * x)\n    return out\n\n"
        "def cubes(xs):\n    out = []\n    for x in xs:\n        out.append(x * x * x)\n    return out\n\n")
PROMPTS = [
    CODE + "def fourth_powers(xs):\n",
    "one two three four five six seven eight nine ten. one two three four five six seven",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps",
    "Once upon a time, in a small village by the sea,",
    "Name three colours:",
    "a b c d e f g a b c d e f g a b c",
]


def _engine(path, **kw) -> LLMEngine:
    kw.setdefault("num_kv_blocks", 256)
    return LLMEngine(EngineConfig(model_path=str(path), **kw))


def _greedy(engine: LLMEngine, prompts, max_tokens=48, **kw) -> list[list[int]]:
    outs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw))
    return [o.output_token_ids for o in outs]


@pytest.fixture(scope="module")
def plain(bundled_model_path):
    engine = _engine(bundled_model_path)
    yield _greedy(engine, PROMPTS)
    engine.close()


needs_kernels = pytest.mark.skipif(not kernels_installed(), reason="bit-identical rows need Ember's CPU kernels")


@needs_kernels
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, None])  # None: k chosen by goodput each step
def test_prompt_lookup_greedy_is_plain_greedy(bundled_model_path, plain, k):
    engine = _engine(bundled_model_path, speculative="ngram", num_speculative_tokens=k)
    assert _greedy(engine, PROMPTS) == plain
    spec = engine.stats().spec
    if k is not None:  # a fixed k drafts wherever a match exists: both outcomes happen
        assert 0 < spec.num_accepted < spec.num_proposed
    engine.close()


@needs_kernels
def test_greedy_is_plain_greedy_under_preemption_and_prefix_hits(bundled_model_path, plain):
    """A pool too small for all six chats preempts (recompute) mid-reply; the second round of the
    same prompts starts from the prefix cache."""
    engine = _engine(bundled_model_path, speculative="ngram", num_speculative_tokens=4, num_kv_blocks=12)
    assert _greedy(engine, PROMPTS) == plain
    assert engine.scheduler.num_preemptions > 0
    assert _greedy(engine, PROMPTS) == plain
    assert engine.block_manager.prefix_hit_rate > 0
    engine.block_manager.check()
    engine.close()


@needs_kernels
def test_draft_model_greedy_is_plain_greedy(bundled_model_path, plain):
    """The bundled model drafting for itself: every draft is accepted (the bonus-token path). The
    second round of the same prompts finds the draft's KV in its own prefix cache."""
    engine = _engine(bundled_model_path, speculative=f"draft:{bundled_model_path}", num_speculative_tokens=3)
    assert _greedy(engine, PROMPTS) == plain
    spec = engine.stats().spec
    assert spec.num_accepted == spec.num_proposed > 0
    draft_cache = engine.speculator.drafter.block_manager
    assert draft_cache.prefix_hit_rate == 0
    assert _greedy(engine, PROMPTS) == plain
    assert draft_cache.prefix_hit_rate > 0
    draft_cache.check()
    engine.close()


class _TestDrafter:
    """A drafter that costs nothing and can always draft (the Drafter protocol's other parts)."""

    shadow = False

    def available(self, seqs, max_k):
        return [max_k] * len(seqs)

    def cost(self, num_seqs, depth):
        return 0.0

    def release(self, seq):
        pass

    def close(self):
        pass


class _WrongDrafter(_TestDrafter):
    """Drafts the token after the last one's id: almost always rejected."""

    name = "wrong"

    def propose(self, seqs, ks):
        return [Draft([(s.token_ids[-1] + j + 1) % 49152 for j in range(k)]) for s, k in zip(seqs, ks)]


@needs_kernels
def test_logits_after_a_rejection_equal_a_fresh_prefill(bundled_model_path, plain):
    engine = LLMEngine(EngineConfig(model_path=str(bundled_model_path), num_kv_blocks=64),
                       speculator=Speculator(_WrongDrafter(), max_k=4, fixed_k=4))
    runner, seen = engine.runner, []
    step_logits = runner.logits

    def recording(out, hidden):
        logits = step_logits(out, hidden)
        seen.append(([list(s.token_ids) for s in out.seqs], list(out.num_spec_tokens), logits.clone()))
        return logits

    runner.logits = recording
    assert _greedy(engine, PROMPTS[:1]) == plain[:1]
    assert engine.stats().spec.num_proposed > engine.stats().spec.num_accepted
    fresh = _engine(bundled_model_path, num_kv_blocks=64)
    checked = 0
    for (_, d, _), (after, _, logits) in zip(seen, seen[1:]):
        if d[0]:  # the step after one that verified (and rejected) drafts: its first row
            ref = _fresh_prefill_logits(fresh, after[0])
            assert torch.equal(logits[0], ref), f"max |Δ| {float((logits[0] - ref).abs().max())}"
            checked += 1
    assert checked >= 3
    fresh.close()
    engine.close()


def _fresh_prefill_logits(engine: LLMEngine, ids: list[int]) -> torch.Tensor:
    """The last row's logits of `ids` computed from scratch in engine's own pool."""
    from engine.scheduler_output import SchedulerOutput
    from engine.sequence import Sequence

    seq = Sequence(ids, SamplingParams(temperature=0.0))
    engine.block_manager.allocate(seq, len(ids), [])
    logits = engine.runner.run_model(SchedulerOutput([seq], [len(ids)], int(len(ids) == 1)))
    engine.block_manager.free(seq)
    return logits[0]


def _chi2_pvalue(observed: list[list[int]]) -> float:
    """Two-or-more-sample chi-square test of homogeneity; torch's regularized gamma for the tail."""
    counts = torch.tensor(observed, dtype=torch.float64)
    counts = counts[:, counts.sum(0) > 0]
    expected = counts.sum(1, keepdim=True) * counts.sum(0, keepdim=True) / counts.sum()
    stat = float(((counts - expected) ** 2 / expected).sum())
    dof = (counts.shape[0] - 1) * (counts.shape[1] - 1)
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


def test_rejection_sampling_emits_the_target_distribution():
    """First token ~ p_1 whatever q is (accepted or recovered); after an acceptance the bonus ~ p_2."""
    g = torch.Generator().manual_seed(0)
    V, N = 6, 20000
    p = torch.softmax(torch.randn(2, V, generator=g, dtype=torch.float64) * 1.5, -1)
    q = torch.softmax(torch.randn(1, V, generator=g, dtype=torch.float64) * 1.5, -1)
    first, bonus = [0] * V, [0] * V
    for _ in range(N):
        x = int(torch.multinomial(q[0], 1, generator=g))
        out = rejection_sample(p, [x], q, g)
        first[out[0]] += 1
        if len(out) == 2:
            bonus[out[1]] += 1
    for counts, target in ((first, p[0]), (bonus, p[1])):
        n = sum(counts)
        expected = [round(float(t) * n * 1000) for t in target]  # a 1000x larger "sample" of the truth
        assert _chi2_pvalue([counts, expected]) > 1e-3, (counts, target)


class _ModeDrafter(_TestDrafter):
    """Drafts, deterministically (q one-hot), the most frequent next token seen in the plain run
    after the reply so far: often right, often wrong."""

    name = "mode"

    def __init__(self, mode: dict[tuple, int], prompt_len: int) -> None:
        self.mode, self.prompt_len = mode, prompt_len

    def propose(self, seqs, ks):
        drafts = []
        for s, k in zip(seqs, ks):
            out = tuple(s.token_ids[self.prompt_len:])
            d = []
            while len(d) < k and out + tuple(d) in self.mode:
                d.append(self.mode[out + tuple(d)])
            drafts.append(Draft(d or [0]))
        return drafts


def _sample_replies(engine: LLMEngine, ids: list[int], n: int = 2400) -> dict[tuple, int]:
    table: dict[tuple, int] = {}
    for start in range(0, n, 128):
        params = [SamplingParams(temperature=1.0, top_k=3, max_tokens=3, seed=start + i, ignore_eos=True)
                  for i in range(128)]
        for o in engine.generate([ids] * 128, params):
            table[tuple(o.output_token_ids)] = table.get(tuple(o.output_token_ids), 0) + 1
    return table


@pytest.mark.parametrize("drafter", ["one-hot", "draft model"])
def test_sampled_output_has_the_target_distribution(tiny_model_factory, drafter):
    """The first three tokens of seeded replies at temperature 1 (top-k 3), with and without
    speculation (drafts verified at tokens 2 and 3): one distribution. One-hot drafts go through
    the draw-and-compare path; the draft model (the target itself, without top-k, so q ≠ p:
    drafts outside the top 3 are rejected, the rest accepted) through rejection sampling."""
    target = tiny_model_factory(seed=1, hidden=32, ffn=64)
    plain_engine = _engine(target, num_kv_blocks=512, max_num_seqs=128)
    ids = plain_engine.tokenizer.encode("ab ab ab ab ab ab ab ab ab")
    plain_counts = _sample_replies(plain_engine, ids)
    plain_engine.close()
    if drafter == "one-hot":
        mode: dict[tuple, tuple[int, int]] = {}
        for reply, c in plain_counts.items():
            for j in range(1, 3):
                key, best = reply[:j], mode.get(reply[:j], (0, -1))
                if c > best[0]:
                    mode[key] = (c, reply[j])
        speculator = Speculator(_ModeDrafter({k: t for k, (_, t) in mode.items()}, len(ids)), max_k=2, fixed_k=2)
        engine = LLMEngine(EngineConfig(model_path=str(target), num_kv_blocks=512, max_num_seqs=128),
                           speculator=speculator)
    else:
        engine = _engine(target, num_kv_blocks=512, max_num_seqs=128, speculative=f"draft:{target}",
                         num_speculative_tokens=2)
    spec_counts = _sample_replies(engine, ids)
    stats = engine.stats().spec
    assert stats.num_proposed > 0 and 0 < stats.num_accepted < stats.num_proposed
    engine.close()
    keys = sorted(set(plain_counts) | set(spec_counts))
    assert _chi2_pvalue([[c.get(k, 0) for k in keys] for c in (plain_counts, spec_counts)]) > 1e-3


def test_a_request_can_turn_speculation_off(bundled_model_path):
    engine = _engine(bundled_model_path, speculative="ngram", num_speculative_tokens=4)
    out = engine.generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=24, speculative=False))[0]
    assert out.num_spec_proposed == 0 and engine.stats().spec.num_proposed == 0
    out = engine.generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=24))[0]
    assert out.num_spec_proposed > 0
    engine.close()


def test_drafts_never_pass_max_tokens_or_a_stop(bundled_model_path):
    """Accepted drafts past max_tokens or a stop string are not part of the reply."""
    engine = _engine(bundled_model_path, speculative="ngram", num_speculative_tokens=8)
    plain_engine = _engine(bundled_model_path)
    for kw in ({"max_tokens": 5}, {"max_tokens": 40, "stop": [" seven"]}):
        a = engine.generate([PROMPTS[1]], SamplingParams(temperature=0.0, **kw))[0]
        b = plain_engine.generate([PROMPTS[1]], SamplingParams(temperature=0.0, **kw))[0]
        assert (a.output_token_ids, a.text, a.finish_reason) == (b.output_token_ids, b.text, b.finish_reason)
    engine.close()
    plain_engine.close()


def test_a_draft_model_of_another_vocabulary_is_refused(tiny_model_factory):
    from engine.speculative.vocab_check import DraftVocabError

    target = tiny_model_factory(num_merges=200)
    other = tiny_model_factory(num_merges=40)  # 160 tokens fewer
    with pytest.raises(DraftVocabError, match="tokens, the target has"):
        _engine(target, speculative=f"draft:{other}")


@needs_kernels
def test_greedy_random_drafts_many_prompts(bundled_model_path):
    """Random prompts made of repeats, goodput-chosen k: the same tokens as without drafts."""
    rng = random.Random(3)
    words = "alpha beta gamma delta ( ) : return x y = + 1 2".split()
    prompts = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 40))) * 2 for _ in range(12)]
    base = _engine(bundled_model_path)
    spec = _engine(bundled_model_path, speculative="ngram")
    assert _greedy(spec, prompts, 32) == _greedy(base, prompts, 32)
    base.close()
    spec.close()


def test_prompt_lookup_on_the_llamacpp_runner_departs_only_at_near_ties(bundled_model_path):
    """llama.cpp's rows depend on their place in the batch (tests/engine/test_same_answer.py), so a
    verify pass may round a logit differently than a one-token decode: greedy output with drafts
    must equal plain output up to a first difference where the plain top-2 logprobs are within
    NEAR_TIE (tests/model_oracles.py's rule)."""
    pytest.importorskip("llama_cpp")
    from model_oracles import NEAR_TIE

    from engine.backends import load_engine

    def engine(**kw):
        return load_engine(EngineConfig(model_path=str(bundled_model_path), num_kv_blocks=256, **kw),
                           backend="llama.cpp")[0]

    plain_engine, spec_engine = engine(), engine(speculative="ngram", num_speculative_tokens=4)
    params = SamplingParams(temperature=0.0, max_tokens=48, logprobs=2)
    for a, b in zip(plain_engine.generate(PROMPTS, params), spec_engine.generate(PROMPTS, params)):
        x, y = a.output_token_ids, b.output_token_ids
        if x != y:
            i = next((j for j in range(min(len(x), len(y))) if x[j] != y[j]), min(len(x), len(y)))
            top = a.logprobs[i].top
            assert top[0][1] - top[1][1] < NEAR_TIE, f"departure at token {i} with top-2 gap {top[0][1] - top[1][1]}"
    spec = spec_engine.stats().spec
    assert 0 < spec.num_accepted < spec.num_proposed
    plain_engine.close()
    spec_engine.close()


@needs_kernels
def test_a_restricted_draft_head_scores_its_rows_exactly(bundled_model_path):
    """FR-Spec's head (engine/speculative/draft_model.py): the first rows' logits, bit for bit."""
    from engine.model_runner import ModelRunner
    from engine.speculative.draft_model import restrict_head

    runner = ModelRunner(EngineConfig(model_path=str(bundled_model_path), num_kv_blocks=16))
    hidden = torch.randn(3, runner.model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    full = runner.model.compute_logits(hidden)
    assert restrict_head(runner.model, runner.vocab_size, rows=16384) == 16384
    assert torch.equal(runner.model.compute_logits(hidden), full[:, :16384])
    ids = torch.tensor([5, 40000])  # a tied table still looks up every token
    assert runner.model.embed(ids).shape == (2, runner.model.config.hidden_size)
    runner.close()
