"""From one step's logits rows to the runner's plain output: sampled tokens and prompt logprobs.

Every runner that produces logits ends its `execute` here (nano-vllm's runner samples too), so
the engine loop never holds a tensor. The rows arrive in `out.seqs` order, `out.num_logits[i]`
of them per sequence: the last one is the sampling row of a sampled sequence, and a sequence
that scores its prompt has one row per new token (row j predicts position c + j + 1). A sequence
that verifies d drafts has d + 1 sampling rows: row j is the target's distribution after draft
j − 1 (engine/sampling/verify.py has the maths of accepting them).

A seeded request draws from its own torch.Generator, kept here from its first sampled step until
it finishes: a preempted sequence keeps it, so its recompute continues the same random stream
and the same seed gives the same text, alone or batched, preempted or not.
"""
from __future__ import annotations

import torch

from engine.sampling.constrained import Constraints
from engine.sampling.sampler import Sampler, apply_penalties, token_logprobs
from engine.runner import RunnerOutput, TokenLogprobs
from engine.scheduler_output import SchedulerOutput
from engine.sequence import Sequence
from engine.sampling.verify import final_probs, num_matching, rejection_sample


class StepSampler:
    def __init__(self) -> None:
        self.sampler = Sampler()
        self.constraints = Constraints()  # logit_bias and grammar masks
        self._generators: dict[int, torch.Generator] = {}  # seq_id -> a seeded request's stream

    @torch.inference_mode()
    def __call__(self, out: SchedulerOutput, logits: torch.Tensor) -> RunnerOutput:
        """`logits`: float32 [sum(out.num_logits), V], on the CPU."""
        sampled: list[Sequence] = []
        spans: list[tuple[int, int]] = []  # per sampled seq: (first row, drafts verified)
        scored: dict[int, list[TokenLogprobs]] = {}
        row = 0
        for seq, k, is_sampled, d in zip(out.seqs, out.num_logits, out.is_sampled, out.num_spec_tokens):
            if seq.scores_prompt:
                scored[seq.seq_id] = self._score_prompt(seq, logits[row:row + k])
            row += k
            if is_sampled:
                sampled.append(seq)
                spans.append((row - 1 - d, d))
        # One sampler call over every row that draws: a sequence's last row, and with drafts each
        # draft's row too (its history holds the drafts before it). Drafts with the drafter's
        # probabilities on a sampled request go through rejection sampling instead.
        rows_idx, row_seqs, hists = [], [], []
        for seq, (first, d) in zip(sampled, spans):
            if d and seq.verifies_by_rejection:
                continue
            for j in range(d + 1):
                rows_idx.append(first + j)
                row_seqs.append(seq)
                hists.append(seq.token_ids + seq.spec_token_ids[:j] if j else seq.token_ids)
        constrained = any(s.params.logit_bias or s.params.grammar is not None for s in row_seqs)
        if constrained or rows_idx != list(range(logits.shape[0])):
            rows = logits[rows_idx]  # a copy: the constraints write into it
            self.constraints.apply(rows, row_seqs)
        else:
            rows = logits  # every row draws, none constrained: no copy
        drawn = self.sampler(rows, [s.params for s in row_seqs], [self._generator(s) for s in row_seqs],
                             hists, [s.num_prompt_tokens for s in row_seqs])
        tokens: list[list[int]] = []
        lps: list[list[TokenLogprobs] | None] = []
        r = 0
        for seq, (first, d) in zip(sampled, spans):
            if d and seq.verifies_by_rejection:
                toks, lp = self._reject(seq, logits[first:first + d + 1])
            else:
                a = num_matching(seq.spec_token_ids[:d], drawn.token_ids[r:r + d])
                toks, lp = drawn.token_ids[r:r + a + 1], drawn.logprobs[r:r + a + 1]
                r += d + 1
            tokens.append(toks)
            lps.append(lp if seq.params.logprobs is not None else None)
        self.constraints.accept(sampled, [t[0] for t in tokens])  # grammar requests never draft
        return RunnerOutput(tokens, lps, scored)

    def _reject(self, seq: Sequence, rows: torch.Tensor) -> tuple[list[int], list[TokenLogprobs]]:
        """Rejection sampling for drafts that came with the drafter's distributions."""
        drafts, n = seq.spec_token_ids, rows.shape[0]
        hists = [seq.token_ids + drafts[:j] for j in range(n)]
        rows = rows.clone()
        self.constraints.apply(rows, [seq] * n)
        p = torch.stack([final_probs(rows[j], seq.params, hists[j], seq.num_prompt_tokens) for j in range(n)])
        toks = rejection_sample(p, drafts, seq.spec_probs, self._generator(seq))
        lp = []
        if seq.params.logprobs is not None:
            pen = apply_penalties(rows.clone(), [seq.params] * n, hists, [seq.num_prompt_tokens] * n)
            logp = torch.log_softmax(pen, dim=-1)
            lp = [token_logprobs(logp[j], t, seq.params.logprobs) for j, t in enumerate(toks)]
        return toks, lp

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
