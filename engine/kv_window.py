"""Sliding-window layers and the paged KV: which blocks such a layer will never read again.

A layer with a window of W keys lets the query at position p read keys p - W < j <= p
(llama.cpp's LLAMA_SWA_TYPE_STANDARD). Every query still to come is at a position >= start
(a sequence's num_computed_tokens when its next step is scheduled; a speculative rollback never
goes below it), so its window-layer keys are >= start - W + 1, and block i (positions
[i B, (i + 1) B)) is never read again by those layers once (i + 1) B <= start - W + 1. Their
K/V in that block can go back to the system while the full-attention layers keep theirs
(engine/kv_pool.py gives pages back per layer), so a long Gemma 3 chat holds its last W tokens
in 5 of every 6 layers. The block itself stays in the table: the global layers still read it.

A prefix-cache hit must then leave the new sequence's window intact: a hit of k blocks is
usable only if the blocks its first query's window reaches, those holding positions
[k B - W + 1, k B), still hold their window-layer K/V. So that the usual hit (the chat's next
turn: every full block of this one) is whole, a sequence keeps the window of its last block
boundary rather than of its last token: at most one block more.
"""
from __future__ import annotations

from collections.abc import Sequence


def blocks_out_of_window(start: int, window: int, block_size: int) -> int:
    """How many leading blocks no query at a position >= start reads in a window layer, keeping
    the window of the sequence's last block boundary too: the chat's next turn hits the prefix
    cache up to there (full blocks only) and reads that window."""
    return max(0, (start // block_size * block_size - window + 1) // block_size) if window else 0


def usable_hits(windowed_out: Sequence[bool], window: int, block_size: int) -> int:
    """How many leading blocks of a prefix hit to take, given whether each hit block's window
    K/V is gone: for a hit of k blocks, the blocks holding [k B - W + 1, k B) must be intact."""
    if not window:
        return len(windowed_out)
    for k in range(len(windowed_out), 0, -1):
        if not any(windowed_out[max(0, k * block_size - window + 1) // block_size:k]):
            return k
    return 0
