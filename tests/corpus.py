"""The fixed text corpus (tests/data/corpus/*.txt: prose, code, six languages, emoji, whitespace
runs) and its cut into CTX-token chunks spread over all of it: the text the fidelity, KV-cache and
same-answer tests score models on, so each of them reads the same tokens."""
from __future__ import annotations

from pathlib import Path

CORPUS = Path(__file__).parent / "data" / "corpus"
CTX = 512
NUM_CHUNKS = 4  # 4 x 511 = 2,044 predictions, chunks spread evenly over the whole corpus


def corpus_text() -> str:
    return "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(CORPUS.glob("*.txt")))


def corpus_chunks(tokens: list[int]) -> list[list[int]]:
    available = len(tokens) // CTX
    assert available >= NUM_CHUNKS, f"corpus too short: {len(tokens)} tokens"
    starts = [round(i * (available - 1) / (NUM_CHUNKS - 1)) * CTX for i in range(NUM_CHUNKS)]
    return [tokens[s:s + CTX] for s in starts]
