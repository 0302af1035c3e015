"""StepSampler: the runners' last stage, from logits rows to plain token ids and logprobs."""
from __future__ import annotations

import math

import torch

from engine.sampling.step_sampler import StepSampler
from engine.sampling_params import SamplingParams
from engine.scheduler_output import SchedulerOutput
from engine.sequence import Sequence, SequenceStatus

V = 50
LOGITS = torch.randn(1, V, generator=torch.Generator().manual_seed(0))


def draws(sampler: StepSampler, seq: Sequence, n: int = 8, preempt_at: int | None = None) -> list[int]:
    tokens = []
    for i in range(n):
        if i == preempt_at:  # the engine releases a preempted sequence; it is WAITING again
            seq.status = SequenceStatus.WAITING
            sampler.release(seq)
        tokens.append(sampler(SchedulerOutput([seq], [1], num_decodes=1), LOGITS).token_ids[0][0])
    return tokens


def decoding(seed: int) -> Sequence:
    seq = Sequence([1, 2, 3], SamplingParams(temperature=1.0, seed=seed))
    seq.num_computed_tokens, seq.status = 2, SequenceStatus.RUNNING
    return seq


def test_a_seeded_stream_survives_preemption_and_ends_with_its_request():
    sampler = StepSampler()
    alone = draws(StepSampler(), decoding(3))
    assert len(set(alone)) > 1, "the draws should differ from step to step"
    seq = decoding(3)
    assert draws(sampler, seq, preempt_at=4) == alone  # same seed, same tokens, preempted or not
    assert draws(StepSampler(), decoding(4)) != alone
    seq.status = SequenceStatus.FINISHED_STOPPED
    sampler.release(seq)  # finished: its generator goes; the same seq_id would start afresh
    seq.status = SequenceStatus.RUNNING
    assert draws(sampler, seq) == alone


def test_rows_are_read_as_the_scheduler_output_says():
    """A prompt-scoring chunk gets a row per new token; the sampled row is a sequence's last."""
    scoring = Sequence([5, 6, 7, 8], SamplingParams(temperature=0.0, prompt_logprobs=1))
    decode = Sequence([9, 10], SamplingParams(temperature=0.0, logprobs=0))
    decode.num_computed_tokens = 1
    out = SchedulerOutput([decode, scoring], [1, 4], num_decodes=1)
    logits = torch.full((5, V), -10.0)
    logits[0, 11] = 10.0  # decode's row: token 11
    for j, t in enumerate([6, 7, 8, 12]):  # scoring's rows predict 6, 7, 8, then its first token 12
        logits[1 + j, t] = 10.0
    result = StepSampler()(out, logits)
    assert result.token_ids == [[11], [12]]
    assert result.logprobs[0][0].token_id == 11 and result.logprobs[1] is None
    scored = result.prompt_logprobs[scoring.seq_id]
    assert [lp.token_id for lp in scored] == [6, 7, 8]  # positions 1..3: the prompt's own tokens
    assert all(math.isclose(lp.logprob, 0.0, abs_tol=1e-6) and lp.top[0][0] == lp.token_id for lp in scored)
    assert decode.seq_id not in result.prompt_logprobs
