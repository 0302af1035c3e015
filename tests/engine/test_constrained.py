"""The sampler's constraints on a tiny vocabulary (llguidance's byte tokenizer: token = byte):
the bitmask keeps exactly the allowed ids, logit_bias adds, and sampling under a grammar, greedy
or random, from random logits yields only text the grammar accepts."""
from __future__ import annotations

import json

import llguidance
import torch

from engine.grammar import JSON_OPTIONS, Grammar
from engine.sampling.constrained import apply_bitmask, apply_logit_bias
from engine.sampling.step_sampler import StepSampler
from engine.sampling_params import SamplingParams
from engine.scheduler_output import SchedulerOutput
from engine.sequence import Sequence, SequenceStatus

BYTES = llguidance.LLTokenizer("byte")  # 256 bytes, then specials; EOS 261


def byte_grammar(schema: dict) -> Grammar:
    source = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_OPTIONS)
    return Grammar(source, llguidance.LLMatcher(BYTES, source), BYTES.vocab_size, tuple(BYTES.eos_tokens))


def test_bitmask_keeps_exactly_the_allowed_ids():
    V = 70
    allowed = {0, 5, 31, 32, 63, 64, 69}
    words = torch.zeros(1, 3, dtype=torch.int32)
    for t in allowed:
        words[0, t // 32] |= 1 << (t % 32) if t % 32 != 31 else -(1 << 31)
    rows = torch.randn(1, V)
    apply_bitmask(rows, words)
    assert {i for i in range(V) if rows[0, i] > float("-inf")} == allowed


def test_logit_bias_adds_per_row():
    rows = torch.zeros(2, 5)
    apply_logit_bias(rows, [{1: 3.0, 9: 1.0}, {4: -100.0}])
    assert rows.tolist() == [[0, 3, 0, 0, 0], [0, 0, 0, 0, -100]]


def _decode(schema: dict, params: dict, steps: int = 200, seed: int = 0) -> str:
    """Random logits through StepSampler, one token a step, as the runners drive it."""
    torch.manual_seed(seed)
    sampler = StepSampler()
    seq = Sequence([0], SamplingParams(max_tokens=steps, grammar=byte_grammar(schema), **params))
    out = []
    for _ in range(steps):
        seq.num_computed_tokens = seq.num_tokens - 1  # the last token is this step's input
        sched = SchedulerOutput(seqs=[seq], num_new_tokens=[1], num_decodes=1)
        t = sampler(sched, torch.randn(1, BYTES.vocab_size) * 3).token_ids[0][0]
        if t in BYTES.eos_tokens:
            break
        out.append(t)
        seq.append_token(t)
    seq.status = SequenceStatus.FINISHED_STOPPED
    sampler.release(seq)
    assert not sampler.constraints._matchers
    return bytes(out).decode()


def test_sampling_under_a_grammar_meets_the_schema():
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "tag": {"enum": ["a", "bc"]}},
              "required": ["n", "tag"], "additionalProperties": False}
    for seed, params in enumerate([{"temperature": 0.0}, {"temperature": 1.0}, {"temperature": 1.5, "top_k": 5},
                                   {"temperature": 1.0, "top_p": 0.9, "min_p": 0.05}]):
        value = json.loads(_decode(schema, params, seed=seed))
        assert set(value) == {"n", "tag"} and 0 <= value["n"] <= 99 and value["tag"] in ("a", "bc")


def test_a_grammar_after_the_think_block_leaves_the_thoughts_free():
    """params.grammar_after_think: the first token may open the block (\\x01 here); inside it any
    token goes (even ones the grammar forbids, like "z"); from the close (\\x02) the grammar holds.
    A reply whose first token is not the opener is held from the start, opener banned after it."""
    from engine.sampling_params import ThinkTags

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    OPEN, CLOSE, Z = 1, 2, ord("z")
    for opens in (True, False):
        torch.manual_seed(0)
        sampler = StepSampler()
        seq = Sequence([0], SamplingParams(max_tokens=60, temperature=0.0, grammar=byte_grammar(schema),
                                           grammar_after_think=ThinkTags(OPEN, CLOSE)))
        out = []
        for step in range(60):
            logits = torch.randn(1, BYTES.vocab_size)
            favoured = (OPEN if opens else ord("{")) if step == 0 else Z if step < 4 else CLOSE if step == 4 else OPEN
            logits[0, favoured] += 100  # what a thinking model would write, if allowed
            seq.num_computed_tokens = seq.num_tokens - 1
            t = sampler(SchedulerOutput(seqs=[seq], num_new_tokens=[1], num_decodes=1), logits).token_ids[0][0]
            if t in BYTES.eos_tokens:
                break
            out.append(t)
            seq.append_token(t)
        if opens:
            assert out[:5] == [OPEN, Z, Z, Z, CLOSE]  # thoughts unmasked
            answer = out[5:]
        else:
            assert out[0] == ord("{") and OPEN not in out and Z not in out  # held from the first token
            answer = out
        assert json.loads(bytes(answer).decode()).keys() == {"ok"}
