"""`ember bench throughput --with-model B`: two models resident at once on the server's own engine
thread, N/2 chats on each, against the same N chats on the first model alone, rounds alternated.

Both run through `EngineThread` (engine/service/engine_thread.py), the loop the server uses: one
thread shares its time evenly between the busy models. Aggregate tok/s = all new tokens / wall
time from submitting the chats to the last token; a model's own tok/s = its tokens / the time
until its last chat ended. Memory: what the budget counts for the resident
models (their runners' weights and KV reservations) and the process's RSS after the round.
"""
from __future__ import annotations

import queue
import statistics
import time

from app.bench.lib.workloads import chat_prompts


def _round(thread, groups, new_tokens: int) -> dict:
    """Submit every group's chats at once ((loaded model, n) each); wait for all of them."""
    from engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    outputs: queue.SimpleQueue = queue.SimpleQueue()
    t0 = time.perf_counter()
    owner, tokens, done_at, left = {}, {}, {}, 0
    for g, (loaded, n) in enumerate(groups):
        for i, prompt in enumerate(chat_prompts(loaded.engine, n)):
            rid = f"g{g}-{i}"
            owner[rid], tokens[g], left = g, 0, left + 1
            thread.submit_sink(prompt, params, rid, loaded.engine, lambda o, rid=rid: outputs.put((rid, o)))
    while left:
        rid, out = outputs.get()
        if isinstance(out, BaseException):
            raise out
        tokens[owner[rid]] += len(out.new_token_ids)
        done_at[owner[rid]] = time.perf_counter() - t0  # its newest token: at the end, its last
        left -= out.finished
    wall = time.perf_counter() - t0
    # each model's own rate: its tokens over the time until its last chat ended
    return {"agg": sum(tokens.values()) / wall, "per_model": [tokens[g] / done_at[g] for g in range(len(groups))]}


def run_two(args, path_a: str, path_b: str) -> int:
    import psutil

    from engine.service.engine_thread import EngineThread
    from engine.service.loading import make_engine_factory
    from engine.service.residency import ResidencyConfig
    from engine.service.served_model import ModelSpec

    n = max(args.concurrency)
    backend = args.backend[0]
    factory = make_engine_factory(backend, args.device, dtype=args.dtype, weights=args.weights,
                                  kv_cache_dtype=args.kv_cache_dtype, num_threads=args.threads,
                                  max_num_seqs=n, max_model_len=1024, enable_prefix_caching=False)
    thread = EngineThread(factory, residency=ResidencyConfig(keep_alive_s=None))
    thread.start()
    try:
        a = thread.load(ModelSpec("a", path_a)).result()
        b = thread.load(ModelSpec("b", path_b)).result()
        _round(thread, [(a, 2), (b, 2)], 4)  # warm-up
        print(f"A {path_a}\nB {path_b}\nbackend {backend}, threads {args.threads}, {args.new_tokens} new tokens "
              f"per chat, greedy, ignore EOS; one engine thread steps both models in turn")
        print(f"resident: A {a.memory_bytes / 2**20:.0f} MiB + B {b.memory_bytes / 2**20:.0f} MiB "
              f"(weights + KV reservations), process RSS {psutil.Process().memory_info().rss / 2**20:.0f} MiB")
        one, one_b, two = [], [], []
        for _ in range(args.rounds):  # alternated, so drift in the machine's speed hits all alike
            one.append(_round(thread, [(a, n)], args.new_tokens))
            two.append(_round(thread, [(a, n // 2), (b, n - n // 2)], args.new_tokens))
            one_b.append(_round(thread, [(b, n)], args.new_tokens))
        med = lambda rows, key=lambda r: r["agg"]: statistics.median(key(r) for r in rows)
        print(f"{n} chats on A alone:          {med(one):8.1f} tok/s")
        print(f"{n} chats on B alone:          {med(one_b):8.1f} tok/s")
        print(f"{n // 2} on A + {n - n // 2} on B together:   {med(two):8.1f} tok/s "
              f"(A {med(two, lambda r: r['per_model'][0]):.1f}, B {med(two, lambda r: r['per_model'][1]):.1f}); "
              f"ratio {med(two) / med(one):.3f}")
        print(f"process RSS after the rounds {psutil.Process().memory_info().rss / 2**20:.0f} MiB")
    finally:
        thread.stop()
    return 0
