"""Prompt lookup (n-gram) drafting: propose what followed the last occurrence of the current suffix.

As vLLM's n-gram proposer and llama.cpp's lookup: find the longest n-gram (max_n down to min_n)
ending the sequence that occurred before in the prompt or the reply so far, and propose the
tokens that followed that occurrence. Code edits, extraction and quoting copy long runs of the
prompt, so these drafts are often long and right; free to compute (an index per sequence, updated
incrementally, so a lookup is O(max_n) dict probes). No torch.
"""
from __future__ import annotations

from engine.sequence import Sequence
from engine.speculative.drafter import Draft


class _Index:
    """n-gram (as a tuple) -> the end of its latest occurrence, over token_ids[:indexed]."""

    __slots__ = ("last_end", "indexed")

    def __init__(self) -> None:
        self.last_end: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # n-grams ending at or before this position are in last_end


class NgramDrafter:
    name = "ngram"
    shadow = True
    memory_bytes = 0

    def __init__(self, min_n: int = 2, max_n: int = 5) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError("need 1 <= min_n <= max_n")
        self.min_n, self.max_n = min_n, max_n
        self._index: dict[int, _Index] = {}

    def lookup(self, seq: Sequence, max_k: int) -> list[int]:
        """The continuation after the latest earlier occurrence of the longest matching suffix."""
        tokens = seq.token_ids
        L = len(tokens)
        idx = self._index.get(seq.seq_id)
        if idx is None:
            idx = self._index[seq.seq_id] = _Index()
        # Index n-grams ending before L (never the suffix itself, which ends at L).
        for end in range(max(idx.indexed + 1, self.min_n), L):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                idx.last_end[tuple(tokens[end - n:end])] = end
        idx.indexed = max(idx.indexed, L - 1)
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            end = idx.last_end.get(tuple(tokens[L - n:]))
            if end is not None:
                return tokens[end:end + max_k]
        return []

    def available(self, seqs: list[Sequence], max_k: int) -> list[int]:
        return [len(self.lookup(s, max_k)) for s in seqs]

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        return [Draft(self.lookup(s, k)) for s, k in zip(seqs, ks)]

    def cost(self, num_seqs: int, depth: int) -> float:
        return 0.0  # dict probes: nothing next to a forward

    def release(self, seq: Sequence) -> None:
        if seq.is_finished:
            self._index.pop(seq.seq_id, None)

    def close(self) -> None:
        self._index.clear()
