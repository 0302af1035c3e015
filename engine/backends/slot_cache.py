"""Which llama.cpp sequence slot holds which tokens: the llama.cpp runner's prompt cache.

llama.cpp's KV cells are not addressed by the engine's block tables, so the block manager's
hash-based prefix cache cannot point into them. Instead, as llama.cpp's own server does, a slot
whose sequence has finished keeps its cells ("idle") together with the tokens they hold. A new
prompt then starts from the longest common prefix (LCP) it shares with any slot:

- it takes the idle slot over when that prefix is most of what the slot holds (the next turn of
  the same chat: history + reply + new message), dropping only the slot's tail;
- otherwise it shares the prefix (`llama_memory_seq_cp`: the cells gain a second sequence id, no
  copy, no compute) from an idle or running slot into a slot of its own (a system prompt that
  many chats or API clients send), and the source keeps its cache.

Idle cells are outside the block manager's accounting, so the runner evicts idle slots (least
recently used first) whenever live + idle cells could exceed llama.cpp's buffer. This file is
the bookkeeping only; the runner makes the llama.cpp calls it implies.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    slot: int  # the slot whose cells hold the prefix
    num_tokens: int  # how many leading tokens of the prompt it holds
    take_over: bool  # an idle slot the new sequence takes (else: share into a slot of its own)


class SlotCache:
    """Free slots, idle slots (with the tokens their cells hold, LRU first) and live slots."""

    def __init__(self, num_slots: int, min_match: int = 16, take_over_fraction: float = 0.5) -> None:
        self.free: list[int] = list(range(num_slots - 1, -1, -1))  # pop() hands out 0 first
        self.idle: OrderedDict[int, list[int]] = OrderedDict()
        self.min_match = min_match
        self.take_over_fraction = take_over_fraction

    @property
    def idle_cells(self) -> int:
        return sum(len(t) for t in self.idle.values())

    def park(self, slot: int, tokens: list[int]) -> None:
        """A finished (or preempted) sequence's slot keeps its cells for later prompts."""
        if tokens:
            self.idle[slot] = list(tokens)
            self.idle.move_to_end(slot)
        else:
            self.free.append(slot)

    def match(self, prompt: list[int], live: dict[int, list[int]], limit: int) -> PrefixMatch | None:
        """The best slot to start `prompt` from (at most `limit` tokens reused), or None when no
        slot shares at least `min_match` tokens. `live` maps running slots to their tokens."""
        best: PrefixMatch | None = None
        for slot, tokens in [*self.idle.items(), *live.items()]:
            n = min(common_prefix_len(prompt, tokens), limit)
            if n < self.min_match or (best is not None and n <= best.num_tokens):
                continue
            take_over = slot in self.idle and n >= self.take_over_fraction * len(tokens)
            best = PrefixMatch(slot, n, take_over)
        return best

    def take(self, slot: int) -> list[int]:
        """Claim an idle slot for a new sequence; returns the tokens its cells hold."""
        return self.idle.pop(slot)

    def acquire(self, keep: int | None = None) -> tuple[int, bool] | None:
        """A slot for a new sequence: a free one, else the least recently used idle one other
        than `keep` (the caller must clear its cells: second item True). None if neither."""
        if self.free:
            return self.free.pop(), False
        for slot in self.idle:
            if slot != keep:
                del self.idle[slot]
                return slot, True
        return None

    def evict_lru(self) -> int | None:
        """Give up the least recently used idle slot (its cells must be cleared by the caller)."""
        if not self.idle:
            return None
        slot, _ = self.idle.popitem(last=False)
        self.free.append(slot)
        return slot
