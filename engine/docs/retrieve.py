"""Hybrid retrieval: BM25 (FTS5) and vector nearest neighbours (sqlite-vec), fused by reciprocal rank.

Reciprocal rank fusion (Cormack, Clarke and Büttcher, SIGIR 2009): a chunk's score is
sum over the rankings r of 1 / (k + rank_r), rank from 1, with k = 60. It needs no calibration
between BM25's unbounded scores and cosine distances, and a chunk that both rankings place high
beats one that only one does; the words of a query (a name, a number) and its meaning both count.
The reported score is that sum divided by its largest possible value (first in every ranking), so
it lies in (0, 1] as OpenAI's search scores do.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import numpy as np

from engine.docs.store import DocStore

RRF_K = 60
CANDIDATES = 50  # each ranking's depth before fusion
Mode = Literal["hybrid", "vector", "bm25"]


@dataclass(frozen=True, slots=True)
class Hit:
    chunk_id: int
    store_id: str
    file_id: str
    filename: str
    location: str
    text: str
    score: float


def rrf(rankings: list[list[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """(id, fused score normalised to (0, 1]) best first; ties keep the first ranking's order."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, 1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    best = len([r for r in rankings if r]) / (k + 1) or 1.0
    return sorted(((i, s / best) for i, s in scores.items()), key=lambda t: -t[1])


def fts_query(text: str) -> str | None:
    """The query's words as an FTS5 OR of quoted terms (so no word is read as FTS5 syntax)."""
    words = list(dict.fromkeys(w.lower() for w in re.findall(r"\w+", text)))
    return " OR ".join(f'"{w}"' for w in words) or None


def bm25_ranking(store: DocStore, store_ids: list[str], query: str, n: int = CANDIDATES) -> list[int]:
    q = fts_query(query)
    if q is None or not store_ids:
        return []
    marks = ",".join("?" * len(store_ids))
    rows = store.db.execute(
        f"SELECT c.id FROM chunks_fts JOIN chunks c ON c.id = chunks_fts.rowid WHERE chunks_fts MATCH ? "
        f"AND c.store_id IN ({marks}) ORDER BY bm25(chunks_fts), c.id LIMIT ?", (q, *store_ids, n)).fetchall()
    return [r[0] for r in rows]


def vector_ranking(store: DocStore, store_ids: list[str], vector: np.ndarray, n: int = CANDIDATES) -> list[int]:
    """Nearest chunks by cosine distance across the stores (each store's partition searched)."""
    v = np.ascontiguousarray(vector, dtype=np.float32)
    found: list[tuple[float, int]] = []
    for sid in store_ids:
        s = store.store(sid)
        if s is None or s.dim is None:
            continue
        if s.dim != v.shape[0]:
            raise ValueError(f"the query vector has {v.shape[0]} dimensions but store {sid} was indexed "
                             f"with {s.dim} (by {s.embed_model})")
        rows = store.db.execute(f"SELECT rowid, distance FROM vec_{s.dim} WHERE embedding MATCH ? AND k = ? "
                                "AND store = ?", (v.tobytes(), n, s.num)).fetchall()
        found += [(d, r) for r, d in rows]
    return [r for _, r in sorted(found)[:n]]


def search(store: DocStore, store_ids: list[str], query: str, vector: np.ndarray | None,
           top_k: int = 5, mode: Mode = "hybrid") -> list[Hit]:
    """The top_k chunks of the stores for the query (its embedding `vector` for the vector side)."""
    rankings = []
    if mode in ("hybrid", "bm25"):
        rankings.append(bm25_ranking(store, store_ids, query))
    if mode in ("hybrid", "vector") and vector is not None:
        rankings.append(vector_ranking(store, store_ids, vector))
    fused = rrf(rankings)[:top_k]
    return hits(store, fused)


def hits(store: DocStore, scored: list[tuple[int, float]]) -> list[Hit]:
    if not scored:
        return []
    marks = ",".join("?" * len(scored))
    rows = store.db.execute(
        f"SELECT c.id, c.store_id, c.file_id, f.filename, c.location, c.text FROM chunks c "
        f"JOIN files f ON f.id = c.file_id WHERE c.id IN ({marks})", [i for i, _ in scored]).fetchall()
    by_id = {r[0]: r for r in rows}
    return [Hit(*by_id[i], score) for i, score in scored if i in by_id]
