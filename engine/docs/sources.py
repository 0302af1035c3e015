"""Found passages into a prompt as numbered sources, and the answer's `[n]` citations read back.

The sources go into the user's turn, not the system prompt: small models follow an instruction
next to the question better than one far above it, and a chat template that drops or merges
system messages (Gemma's) keeps them. Each source is numbered and named by file and location, so
the answer can cite `[1]` and the window can link it to the passage (it imports `citations`).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the window imports this module too: no numpy or store behind it
    from engine.docs.retrieve import Hit

INSTRUCTION = ("Use the numbered sources below to answer. Cite each source you use by its number in square "
               "brackets, like [1]. If the sources do not hold the answer, say so.")
_CITE = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")


def label(hit: Hit) -> str:
    return f"{hit.filename}, {hit.location}" if hit.location else hit.filename


def sources_block(hits: list[Hit]) -> str:
    """The instruction and the numbered sources: what goes before the user's own words."""
    blocks = "\n\n".join(f"[{i}] {label(h)}\n{h.text.strip()}" for i, h in enumerate(hits, 1))
    return f"{INSTRUCTION}\n\n<sources>\n{blocks}\n</sources>\n\nQuestion: "


def with_sources(question: str, hits: list[Hit]) -> str:
    """The user's turn with the sources before the question; the question alone without any."""
    return sources_block(hits) + question if hits else question


def citations(answer: str, n_sources: int) -> list[tuple[int, int, int]]:
    """(source number, start, end) of each citation in the answer, for numbers 1..n_sources:
    `[1]` and each number of `[1, 2]` (start/end span the whole bracket)."""
    out = []
    for m in _CITE.finditer(answer):
        for part in m.group(1).split(","):
            n = int(part)
            if 1 <= n <= n_sources:
                out.append((n, m.start(), m.end()))
    return out


def cited_sources(answer: str, n_sources: int) -> list[int]:
    """The source numbers the answer cites, in order of first citation."""
    return list(dict.fromkeys(n for n, _, _ in citations(answer, n_sources)))
