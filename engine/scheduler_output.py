"""What one step computes: the scheduler's output, read by the runners and the engine. No torch.

Which sequences, how many new tokens each (known tokens, then drafts to verify), and which of
their rows need logits: decided here once, so every runner and the engine read the same rule.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from engine.sequence import Sequence


@dataclass(slots=True)
class SchedulerOutput:
    seqs: list[Sequence]  # decodes first, then prefill chunks
    num_new_tokens: list[int]  # compute seq.token_ids[c : c + n], c = seq.num_computed_tokens
    num_decodes: int  # the first num_decodes seqs have exactly one new token
    preempted: list[Sequence] = field(default_factory=list)  # their KV was freed this step
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst): copy before the forward
    finished: list[Sequence] = field(default_factory=list)  # ended here: cannot fit even alone
    # per seq: how many of its new tokens are drafts (seq.spec_token_ids, after its known tokens)
    num_spec_tokens: list[int] = field(default_factory=list)
    # Which rows get logits, decided here once for the runners and the engine (at construction:
    # postprocess moves num_computed_tokens on afterwards).
    is_sampled: list[bool] = field(init=False)  # per seq: all known tokens computed after this step
    num_logits: list[int] = field(init=False)  # per seq: logits for its last num_logits new tokens

    def __post_init__(self) -> None:
        if not self.num_spec_tokens:
            self.num_spec_tokens = [0] * len(self.seqs)
        # A sequence yields a token once every known token has K/V: the logits of its last new
        # token, and with d drafts the d before it too (row j verifies draft j). One that scores
        # its prompt needs every new token's logits (row j predicts c+j+1).
        # An embedding's rows are pooled, never sampled (embedding_rows).
        self.is_sampled = [s.num_computed_tokens + n - d == len(s.token_ids) and not s.params.embed
                           for s, n, d in zip(self.seqs, self.num_new_tokens, self.num_spec_tokens)]
        self.num_logits = [n if s.scores_prompt else (1 + d if sampled else 0)
                           for s, n, d, sampled in zip(self.seqs, self.num_new_tokens, self.num_spec_tokens,
                                                       self.is_sampled)]

    def embedding_rows(self) -> list[tuple[Sequence, int, int]]:
        """(seq, first row, rows) in the step's flattened new tokens, per embedding sequence."""
        spans, start = [], 0
        for s, n in zip(self.seqs, self.num_new_tokens):
            if s.params.embed:
                spans.append((s, start, n))
            start += n
        return spans

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def sampled_seqs(self) -> list[Sequence]:
        """The sequences that yield a token this step, in seqs order."""
        return [s for s, is_sampled in zip(self.seqs, self.is_sampled) if is_sampled]

    def logit_rows(self) -> list[int]:
        """Indices into the step's flattened new tokens whose logits the runner computes, in
        seqs order: each sequence's last num_logits new tokens."""
        rows: list[int] = []
        start = 0
        for n, k in zip(self.num_new_tokens, self.num_logits):
            rows.extend(range(start + n - k, start + n))
            start += n
        return rows


class PromptCache(Protocol):
    """KV kept outside the block manager that a new prompt can start from (the llama.cpp
    runner's slots): `match_prompt` says how many leading tokens are there (no side effects),
    `claim_prompt` hands them to the sequence and returns how many it got (at most the match)."""

    @property
    def num_cached_tokens(self) -> int:
        """Tokens held for later prompts (the cache's size, for stats)."""
        ...

    def match_prompt(self, seq: Sequence) -> int: ...

    def claim_prompt(self, seq: Sequence, num_tokens: int) -> int: ...
