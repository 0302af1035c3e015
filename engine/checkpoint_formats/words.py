"""Codes <-> int32 words: P = 32 // bits consecutive codes per word, the first in the lowest bits
(the packing every layout here shares; see engine/checkpoint_formats/__init__.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def as_int32(u: torch.Tensor) -> torch.Tensor:
    """int64 values in 0 .. 2^32 - 1 -> int32 with the same bits."""
    u = u & 0xFFFFFFFF
    return torch.where(u >= 2**31, u - 2**32, u).to(torch.int32)


def codes_to_words(codes: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words of 32/bits consecutive codes along `dim`, first code lowest; zero-padded."""
    per = 32 // bits
    c = codes.to(torch.int64).movedim(dim, -1)
    c = F.pad(c, (0, -c.shape[-1] % per))
    c = c.reshape(*c.shape[:-1], -1, per) << (torch.arange(per) * bits)
    return as_int32(c.sum(-1)).movedim(-1, dim).contiguous()  # fields are disjoint: sum == or


def words_to_codes(words: torch.Tensor, bits: int, dim: int, n: int) -> torch.Tensor:
    """uint8 codes: the inverse of codes_to_words, cut to n along `dim`."""
    per = 32 // bits
    u = words.to(torch.int64).movedim(dim, -1) & 0xFFFFFFFF
    c = (u.unsqueeze(-1) >> (torch.arange(per) * bits)) & ((1 << bits) - 1)
    return c.reshape(*u.shape[:-1], -1)[..., :n].movedim(-1, dim).to(torch.uint8).contiguous()


def ones_word(bits: int) -> int:
    """A 1 in every field of a word: 0x11111111 for 4 bits, 0x01010101 for 8."""
    return sum(1 << (bits * i) for i in range(32 // bits))


def add_words(words: torch.Tensor, delta: int) -> torch.Tensor:
    return as_int32(words.to(torch.int64) + delta)
