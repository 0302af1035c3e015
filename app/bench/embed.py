"""`ember bench embed`: embeddings per second for a batch of short texts, Ember's server
(/v1/embeddings on a real engine process, one request of --texts inputs) against
llama-cpp-python's `Llama(embedding=True).embed` on the same file, in one run.

Both are mean-pooled and L2-normalized (Ember's default for a file that names no pooling); the
largest 1 - cosine between the two sides' vectors is printed next to the speeds, so a faster
side that computed something else shows.
"""
from __future__ import annotations

import secrets
import statistics
import tempfile
import time
from pathlib import Path

WORDS = ("the quick brown fox jumps over a lazy dog while rain falls on quiet hills and rivers "
         "carry stones toward distant seas where ships sail under silver clouds").split()


def texts(n: int) -> list[str]:
    """`n` short, distinct sentences (6 to 17 words), the same every run."""
    return [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(6 + i % 12)) + f" ({i})"
            for i in range(n)]


def bench_ember(model: str, inputs: list[str], threads: int, runs: int) -> tuple[list[float], list]:
    import httpx

    from app.engine_process import EngineProcess

    key = secrets.token_urlsafe(16)
    log_path = Path(tempfile.mkdtemp(prefix="ember-bench-embed-")) / "engine.log"
    proc = EngineProcess(["--model", model, "--threads", str(threads)], api_key=key, log_path=log_path)
    proc.start(timeout=300)
    try:
        headers = {"Authorization": f"Bearer {key}"}
        served = httpx.get(proc.base_url + "/v1/models", headers=headers, timeout=30).json()["data"][0]["id"]

        def once():
            r = httpx.post(proc.base_url + "/v1/embeddings", headers=headers, timeout=600,
                           json={"model": served, "input": inputs})
            r.raise_for_status()
            return [d["embedding"] for d in r.json()["data"]]

        once()  # builds the embeddings context
        times, vectors = [], None
        for _ in range(runs):
            t0 = time.perf_counter()
            vectors = once()
            times.append(time.perf_counter() - t0)
        return times, vectors
    finally:
        proc.stop()


def bench_llama_cpp(model: str, inputs: list[str], threads: int, runs: int) -> tuple[list[float], list, int]:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=model, embedding=True, verbose=False, n_threads=threads,
                          n_threads_batch=threads, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    llm.embed(inputs[:8])
    times, vectors = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        vectors = llm.embed(inputs, normalize=True)
        times.append(time.perf_counter() - t0)
    tokens = sum(len(llm.tokenize(t.encode())) for t in inputs)
    return times, vectors, tokens


def run(args) -> int:
    import numpy as np

    from engine.model_files.bundled import default_model_path

    model = args.model or str(default_model_path())
    inputs = texts(args.texts)
    ember_t, ember_v = bench_ember(model, inputs, args.threads, args.runs)
    ref_t, ref_v, tokens = bench_llama_cpp(model, inputs, args.threads, args.runs)
    a, b = np.asarray(ember_v, dtype=np.float64), np.asarray(ref_v, dtype=np.float64)
    cos = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    e, r = statistics.median(ember_t), statistics.median(ref_t)
    print(f"model {model}: {len(inputs)} texts, {tokens} tokens, {args.threads} threads, median of {args.runs}")
    print(f"{'':<28}{'texts/s':>10}{'tokens/s':>10}")
    print(f"{'Ember /v1/embeddings':<28}{len(inputs) / e:>10.1f}{tokens / e:>10.0f}")
    print(f"{'llama-cpp-python embed':<28}{len(inputs) / r:>10.1f}{tokens / r:>10.0f}")
    print(f"Ember / llama-cpp-python: {r / e:.2f}x; largest 1 - cosine between them: {1 - cos.min():.2e}")
    return 0


def register(bench_sub) -> None:
    p = bench_sub.add_parser("embed", help="embeddings per second: Ember's server vs llama-cpp-python's embed")
    p.add_argument("--model", "-m", help="GGUF file (default: the bundled model)")
    p.add_argument("--threads", "-t", type=int, default=2)
    p.add_argument("--texts", type=int, default=256, help="short texts in the batch (at most 256 a request)")
    p.add_argument("--runs", type=int, default=3)
    p.set_defaults(func=run)
