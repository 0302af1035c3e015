"""A helper the block manager's tests share."""
from __future__ import annotations


def prefix_keys(tokens) -> list[int]:
    """keys[p] names tokens[:p+1] (a chained hash: the K/V of position p depend on all of them)."""
    keys, h = [], 0
    for t in tokens:
        h = hash((h, t))
        keys.append(h)
    return keys
