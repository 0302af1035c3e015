"""From one step's logits rows to the runner's plain output: sampled tokens and prompt logprobs.

Every runner that produces logits ends its `execute` here (nano-vllm's runner samples too), so
the engine loop never holds a tensor. The rows arrive in `out.seqs` order, `out.num_logits[i]`
of them per sequence: the last one is the sampling row of a sampled sequence, and a sequence
that scores its prompt has one row per new token (row j predicts position c + j + 1).

A seeded request draws from its own torch.Generator, kept here from its first sampled step until
it finishes: a preempted sequence keeps it, so its recompute continues the same random stream
and the same seed gives the same text, alone or batched, preempted or not.
"""
from __future__ import annotations

import torch

from engine.layers.constrained import Constraints
from engine.layers.sampler import Sampler, token_logprobs
from engine.runner import RunnerOutput, TokenLogprobs
from engine.scheduler import SchedulerOutput
from engine.sequence import Sequence


class StepSampler:
    def __init__(self) -> None:
        self.sampler = Sampler()
        self.constraints = Constraints()  # logit_bias and grammar masks
        self._generators: dict[int, torch.Generator] = {}  # seq_id -> a seeded request's stream

    @torch.inference_mode()
    def __call__(self, out: SchedulerOutput, logits: torch.Tensor) -> RunnerOutput:
        """`logits`: float32 [sum(out.num_logits), V], on the CPU."""
        sample_rows: list[int] = []
        sampled: list[Sequence] = []
        scored: dict[int, list[TokenLogprobs]] = {}
        row = 0
        for seq, k, is_sampled in zip(out.seqs, out.num_logits, out.is_sampled):
            if seq.scores_prompt:
                scored[seq.seq_id] = self._score_prompt(seq, logits[row:row + k])
            row += k
            if is_sampled:
                sample_rows.append(row - 1)
                sampled.append(seq)
        rows = logits[sample_rows]  # a copy: the constraints write into it
        self.constraints.apply(rows, sampled)
        result = self.sampler(
            rows, [s.params for s in sampled], [self._generator(s) for s in sampled],
            [s.token_ids for s in sampled], [s.num_prompt_tokens for s in sampled])
        self.constraints.accept(sampled, result.token_ids)
        return RunnerOutput(result.token_ids, result.logprobs, scored)

    def _generator(self, seq: Sequence) -> torch.Generator | None:
        params = seq.params
        if params.seed is None or params.is_greedy:
            return None  # the sampler's default stream
        gen = self._generators.get(seq.seq_id)
        if gen is None:
            gen = self._generators[seq.seq_id] = torch.Generator().manual_seed(params.seed)
        return gen

    @staticmethod
    def _score_prompt(seq: Sequence, rows: torch.Tensor) -> list[TokenLogprobs]:
        """Logprobs of the prompt positions c+1 ... these rows predict (none past the prompt)."""
        c = seq.num_computed_tokens
        end = min(c + rows.shape[0] + 1, seq.num_prompt_tokens)
        if end <= c + 1:
            return []
        logp = torch.log_softmax(rows.float(), dim=-1)
        k = seq.params.prompt_logprobs
        return [token_logprobs(logp[pos - c - 1], seq.token_ids[pos], k) for pos in range(c + 1, end)]

    def release(self, seq) -> None:
        """A finished request's generator and matcher go; a preempted one keeps them."""
        self.constraints.release(seq)
        if seq.seq_id in self._generators and seq.is_finished:
            del self._generators[seq.seq_id]
