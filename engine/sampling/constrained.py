"""What a request forbids or favours before the sampler draws: logit_bias and grammar masks.

One implementation for every runner: StepSampler (which both the torch and the llama.cpp runner
end their step with) passes each step's sampling rows through `Constraints.apply` and reports
the drawn tokens to `Constraints.accept`. A request with a grammar gets its own llguidance
matcher on its first sampled step; the matcher says which tokens may come next as a bitmask
(one bit per token id), and every other token's logit becomes -inf, so greedy and random
sampling, top-k/top-p and logprobs all see only what the grammar allows.

A reasoning model's request may think before the grammar holds (params.grammar_after_think):
its first token may be the grammar's or `<think>`; inside the block nothing is masked, and the
matcher starts after `</think>`, whether the model sampled it or the thinking budget wrote it.
The state is read from the sequence's own tokens each step, so nothing else needs telling.

A preempted request keeps its matcher (its recompute resamples nothing it already emitted);
a finished one drops it.
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from engine.sequence import Sequence

log = logging.getLogger(__name__)


def thinking(seq: Sequence) -> bool | None:
    """For a grammar that waits for the think block: True while the reply is inside it, None
    before the reply's first token (the block may still open), False once the grammar holds."""
    tags = seq.params.grammar_after_think
    if tags is None:
        return False
    out = seq.output_token_ids
    if not tags.starts_inside:
        if not out:
            return None
        if out[0] != tags.open_id:
            return False
    return tags.close_id not in out


def apply_logit_bias(rows: torch.Tensor, biases: list[dict[int, float]]) -> None:
    """In place: rows[r, t] += biases[r][t] (OpenAI's logit_bias: -100 bans, +100 forces)."""
    V = rows.shape[1]
    idx, val = [], []
    for r, bias in enumerate(biases):
        for t, b in bias.items():
            if 0 <= t < V:
                idx.append(r * V + t)
                val.append(b)
    if idx:
        rows.view(-1).index_add_(0, torch.tensor(idx), torch.tensor(val, dtype=rows.dtype))


def apply_bitmask(rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place on float32 CPU rows [n, V]: -inf wherever the bit of token t (bit t % 32 of
    word t // 32, little-endian) is 0.

    numpy, one thread: unpackbits and putmask over a 152k vocabulary take about 0.5 ms, while
    torch's multi-threaded elementwise ops on a shared 2-core machine wait for each other at
    every barrier (measured: tens of ms a step under load)."""
    n, V = rows.shape
    width = min(V, bitmask.shape[1] * 32)
    allowed = np.unpackbits(bitmask.numpy().view(np.uint8), axis=-1, bitorder="little", count=width)
    x = rows.numpy()
    np.putmask(x[:, :width], allowed == 0, -np.inf)
    if width < V:
        x[:, width:] = -np.inf


def _bit(i: int) -> int:
    """Bit i of an int32 mask word, as the signed value torch stores (bit 31 is negative)."""
    return (1 << i) - (1 << 32) if i == 31 else 1 << i


class Constraints:
    def __init__(self) -> None:
        self._matchers: dict[int, object] = {}  # seq_id -> its llguidance.LLMatcher
        self._bitmask = torch.empty(0, 0, dtype=torch.int32)

    def apply(self, rows: torch.Tensor, seqs: list[Sequence]) -> None:
        """rows [len(seqs), V], one sampling row per sequence, changed in place."""
        biases = [s.params.logit_bias for s in seqs]
        if any(biases):
            apply_logit_bias(rows, biases)
        masked = [(r, self._matcher(s)) for r, s in enumerate(seqs)
                  if s.params.grammar is not None and thinking(s) is not True]
        if not masked:
            return
        words = (seqs[masked[0][0]].params.grammar.vocab_size + 31) // 32
        if self._bitmask.shape[0] < len(masked) or self._bitmask.shape[1] != words:
            self._bitmask = torch.empty(max(len(masked), 8), words, dtype=torch.int32)
        mask = self._bitmask[:len(masked)]
        for k, (_, m) in enumerate(masked):
            if m.is_error():  # cannot happen with masked sampling; end the reply rather than emit junk
                log.warning("grammar matcher failed: %s", m.get_error())
                mask[k].zero_()
                for t in seqs[masked[k][0]].params.grammar.eos_ids:
                    mask[k, t // 32] |= _bit(t % 32)
                continue
            row = mask[k]
            m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)
            seq = seqs[masked[k][0]]
            if thinking(seq) is None:  # the first token: the grammar's, or <think>
                t = seq.params.grammar_after_think.open_id
                row[t // 32] |= _bit(t % 32)
        if len(masked) == rows.shape[0]:
            apply_bitmask(rows, mask)
            return
        for k, (r, _) in enumerate(masked):
            apply_bitmask(rows[r:r + 1], mask[k:k + 1])

    def accept(self, seqs: list[Sequence], tokens: list[int]) -> None:
        """Advance each constrained sequence's matcher past the token it drew."""
        for s, t in zip(seqs, tokens):
            m = self._matchers.get(s.seq_id)
            state = thinking(s)  # before t: the sequence's tokens do not hold it yet
            if state or (state is None and t == s.params.grammar_after_think.open_id):
                continue  # a thought, or the block's opening: not the grammar's
            if m is not None and not m.is_error() and not m.is_stopped():
                m.consume_token(t)

    def _matcher(self, seq: Sequence):
        m = self._matchers.get(seq.seq_id)
        if m is None:
            m = self._matchers[seq.seq_id] = seq.params.grammar.matcher()
        return m

    def release(self, seq: Sequence) -> None:
        if seq.is_finished:
            self._matchers.pop(seq.seq_id, None)
