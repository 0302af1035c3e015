"""`ember bench rag`: documents indexing speed and retrieval quality, in one run.

Indexing: chunks per second end to end (the Indexer as `ember docs add` runs it: reading, converting
and chunking each file, embedding by llama.cpp's embeddings context as the engine does, writing
chunks, FTS5 rows and vectors in a fresh store), against llama-cpp-python's bare
`Llama(embedding=True).embed` of the same chunk texts on the same GGUF and threads in the same run;
the ratio is the pipeline's overhead (each side warmed by one text first). The largest 1 - cosine
between the two sides' vectors of the first chunks shows both computed the same thing.

Retrieval: each question of each set (app/bench/rag_sets.py: Python's reference topics, and the
tests' own set in a source checkout) searched in its set's collection by hybrid (RRF), vectors only
and BM25 only: recall@5 (the answering file among the top 5 passages' files) and MRR (1 / rank of
its first passage in the top 10; 0 beyond). A line says where hybrid falls behind either alone. The
pydoc questions are key words of a sentence of their topic, BM25's best case (the exact words are
there); the kit's are written questions whose words only partly match their passage.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

MODES = ("hybrid", "vector", "bm25")
DEPTH = 10  # passages ranked per question for MRR


class TimedEmbed:
    """The embedder, with the seconds spent inside it summed (the pipeline's time less this is
    reading, converting, chunking and writing)."""

    def __init__(self, embed) -> None:
        self.embed, self.seconds = embed, 0.0

    def __call__(self, texts: list[str]):
        t0 = time.perf_counter()
        try:
            return self.embed(texts)
        finally:
            self.seconds += time.perf_counter() - t0


def index_set(store, rag_set, embed, model_id: str) -> tuple[str, int, float]:
    """(collection id, chunks, seconds) of indexing the set's folder into a new collection."""
    from engine.docs.indexer import Indexer

    target = store.create_store(rag_set.name)
    indexer = Indexer(store, embed, model_id)
    t0 = time.perf_counter()
    for path in sorted(rag_set.folder.iterdir()):
        f = indexer.add_path(target.id, path)
        sf = indexer.index(target.id, f.id)
        if sf.status != "completed":
            raise RuntimeError(f"{path.name} was not indexed: {sf.error}")
    seconds = time.perf_counter() - t0
    return target.id, sum(f.chunks for f in store.store_files(target.id)), seconds


def bare_embed(model_path: str, texts: list[str], threads: int, n_ctx: int):
    """(seconds, vectors) of llama-cpp-python's own embed over the texts, warmed by one."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=model_path, embedding=True, verbose=False, n_ctx=n_ctx, n_batch=n_ctx,
                          n_ubatch=n_ctx, n_threads=threads, n_threads_batch=threads,
                          pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    llm.embed(texts[:1])
    t0 = time.perf_counter()
    vectors = llm.embed(texts, normalize=True)
    return time.perf_counter() - t0, vectors


def quality(store, store_id: str, questions, embed) -> dict[str, dict[str, float]]:
    from engine.docs.retrieve import search

    scores = {m: {"recall@5": 0.0, "mrr": 0.0} for m in MODES}
    for q in questions:
        vector = embed([q.text])[0]
        for mode in MODES:
            files = [h.filename for h in search(store, [store_id], q.text, vector, top_k=DEPTH, mode=mode)]
            rank = files.index(q.filename) + 1 if q.filename in files else None
            scores[mode]["recall@5"] += rank is not None and rank <= 5
            scores[mode]["mrr"] += 1 / rank if rank else 0.0
    n = max(len(questions), 1)
    return {m: {k: v / n for k, v in s.items()} for m, s in scores.items()}


def _speed(store, rag_set, embed, model, threads: int) -> dict:
    import numpy as np

    timed = TimedEmbed(embed)
    store_id, chunks, seconds = index_set(store, rag_set, timed, model.id)
    texts = [r[0] for r in store.db.execute("SELECT text FROM chunks WHERE store_id=? ORDER BY id", (store_id,))]
    bare_s, bare_v = bare_embed(model.path, texts, threads, embed.n_ctx)
    a = np.asarray(embed(texts[:16]), dtype=np.float64)
    b = np.asarray(bare_v[:16], dtype=np.float64)
    cos = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {"set": rag_set.name, "files": len(list(rag_set.folder.iterdir())), "chunks": chunks,
            "pipeline_s": seconds, "pipeline_embed_s": timed.seconds, "pipeline_chunks_per_s": chunks / seconds,
            "bare_embed_s": bare_s,
            "bare_chunks_per_s": len(texts) / bare_s, "overhead": seconds / bare_s,
            "max_1_minus_cos": float(1 - cos.min()), "store_id": store_id}


def run(args) -> int:
    from app.bench.rag_sets import asked_set, kit_set, pydoc_set
    from app.docs_local import LocalEmbedder, embedding_model
    from app.settings import Settings
    from engine.docs.store import DB_NAME, DocStore

    model = embedding_model(Settings.load(), args.embedding_model)
    embed = LocalEmbedder(model, args.threads)
    embed(["warm up"])
    tmp = Path(tempfile.mkdtemp(prefix="ember-bench-rag-"))
    store = DocStore(tmp / DB_NAME)
    sets = [pydoc_set(tmp / "pydoc", args.topics)] if "pydoc" in args.sets else []
    kit = kit_set(tmp / "kit") if "kit" in args.sets else None
    sets += [kit] if kit is not None else []
    results = {"model": model.id, "threads": embed.threads, "indexing": None, "retrieval": {}}
    for i, s in enumerate(sets):
        if i == 0:
            results["indexing"] = _speed(store, s, embed, model, embed.threads)
            store_id = results["indexing"].pop("store_id")
        else:
            store_id = index_set(store, s, embed, model.id)[0]
        for q in [s, asked_set(s)] if s.name == "pydoc" else [s]:  # the written questions: the same index
            results["retrieval"][q.name] = {"questions": len(q.questions), **quality(store, store_id, q.questions, embed)}
    embed.close()
    store.close()
    _print(results, "kit" in args.sets and kit is None)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def _print(r: dict, kit_missing: bool) -> None:
    x = r["indexing"]
    print(f"embedding model {r['model']}, {r['threads']} threads")
    if x:
        print(f"indexing ({x['set']}: {x['files']} files, {x['chunks']} chunks):")
        print(f"  Ember pipeline (convert, chunk, embed, store)  {x['pipeline_chunks_per_s']:8.1f} chunks/s "
              f"({x['pipeline_s']:.2f} s)")
        print(f"  llama-cpp-python Llama.embed (same texts)      {x['bare_chunks_per_s']:8.1f} chunks/s "
              f"({x['bare_embed_s']:.2f} s)")
        print(f"  pipeline / bare time: {x['overhead']:.2f}x; largest 1 - cosine between them: "
              f"{x['max_1_minus_cos']:.1e}")
        print(f"  of the pipeline's {x['pipeline_s']:.2f} s, embedding took {x['pipeline_embed_s']:.2f} s and "
              f"reading, converting, chunking and writing {x['pipeline_s'] - x['pipeline_embed_s']:.2f} s")
    print(f"{'set':<8}{'questions':>10}" + "".join(f"{m + ' R@5':>14}{m + ' MRR':>14}" for m in MODES))
    for name, q in r["retrieval"].items():
        print(f"{name:<8}{q['questions']:>10}" + "".join(f"{q[m]['recall@5']:>14.3f}{q[m]['mrr']:>14.3f}"
                                                         for m in MODES))
    for name, q in r["retrieval"].items():
        for metric in ("recall@5", "mrr"):
            behind = [m for m in MODES[1:] if q[m][metric] > q["hybrid"][metric]]
            if behind:
                print(f"note: on {name}, hybrid's {metric} is below {' and '.join(behind)} alone")
    if kit_missing:
        print("(the kit set needs a source checkout: tests/docs_kit.py)")


def register(bench_sub) -> None:
    p = bench_sub.add_parser("rag", help="documents: indexing chunks/s vs llama-cpp-python's embed, and recall@5 "
                                         "of hybrid, vector and BM25 retrieval")
    p.add_argument("--embedding-model", help="an installed embedding model's id or a GGUF file (default: "
                                             "settings' embedding_model, else the first installed)")
    p.add_argument("--threads", "-t", type=int, default=None, help="CPU threads (default: all)")
    p.add_argument("--topics", type=int, default=None,
                   help="only the N shortest of Python's help topics, a quick run (default: all)")
    p.add_argument("--sets", nargs="+", choices=("pydoc", "kit"), default=["pydoc", "kit"])
    p.add_argument("--json", metavar="FILE", help="also write the figures here")
    p.set_defaults(func=run)
