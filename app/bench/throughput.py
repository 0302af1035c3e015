"""`ember bench throughput`: N concurrent chats of 128 new tokens, Ember's continuous batching
next to llama-cpp-python serving the same chats one after another, in one run.

Aggregate tok/s = all new tokens / wall time from the first request to the last token.
TTFT is per chat from the moment all N are submitted; per-chat tok/s excludes TTFT.
"""
from __future__ import annotations

import statistics
import time

from app.bench import add_model_args
from app.bench.lib.workloads import build_engine, chat_prompts
from app.bench.synthetic import add_synthetic_args, bench_model_path

def run_ember(engine, prompts, new_tokens: int) -> dict:
    from engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    ids = [engine.add_request(p, params) for p in prompts]
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    total = 0
    while engine.has_unfinished():
        for o in engine.step():
            now = time.perf_counter()
            total += len(o.new_token_ids)
            first.setdefault(o.request_id, now)
            last[o.request_id] = now
    wall = time.perf_counter() - t0
    per_chat = [(new_tokens - 1) / (last[i] - first[i]) for i in ids if last[i] > first[i]]
    return {"agg": total / wall, "ttft": statistics.median(first[i] - t0 for i in ids),
            "per_chat": statistics.median(per_chat) if per_chat else float("nan")}


def run_llamacpp(llm, prompts, new_tokens: int) -> dict:
    t0 = time.perf_counter()
    ttfts, per_chat, total = [], [], 0
    for p in prompts:
        t_first, n = None, 0
        for _ in llm.generate(p, temp=0.0, reset=True):
            n += 1
            if t_first is None:
                t_first = time.perf_counter()
                ttfts.append(t_first - t0)
            if n >= new_tokens:
                break
        per_chat.append((n - 1) / (time.perf_counter() - t_first))
        total += n
    wall = time.perf_counter() - t0
    return {"agg": total / wall, "ttft": statistics.median(ttfts), "per_chat": statistics.median(per_chat)}


def run(args) -> int:
    import llama_cpp

    path = bench_model_path(args)
    if args.with_model:  # two models resident at once (app/bench/two_models.py)
        from app.bench.two_models import run_two

        return run_two(args, path, args.with_model)
    engines = {b: build_engine(path, args, b) for b in args.backend}
    llm = llama_cpp.Llama(model_path=path, n_ctx=1024, n_threads=args.threads, verbose=False)
    for engine in engines.values():
        run_ember(engine, chat_prompts(engine, 2), 4)  # warm-up
    run_llamacpp(llm, chat_prompts(next(iter(engines.values())), 1), 4)  # its first chat pays its warm-up too
    print(f"model {path}\nthreads {args.threads}, dtype {args.dtype}, {args.new_tokens} new tokens per chat, "
          "greedy, ignore EOS; llama-cpp-python serves the chats one after another")
    cols = "".join(f" | {'ember/' + b + ' agg':>20} {'TTFT s':>7} {'per-chat':>8}" for b in engines)
    print(f"{'chats':>5}{cols} | {'llama-cpp-python agg':>20} {'TTFT s':>7} {'per-chat':>8}")
    tokenizer_engine = next(iter(engines.values()))
    for n in args.concurrency:
        prompts = chat_prompts(tokenizer_engine, n)
        row = f"{n:>5}"
        for engine in engines.values():
            e = run_ember(engine, prompts, args.new_tokens)
            row += f" | {e['agg']:>20.1f} {e['ttft']:>7.2f} {e['per_chat']:>8.1f}"
        l = run_llamacpp(llm, prompts[:args.llamacpp_max], args.new_tokens)
        print(f"{row} | {l['agg']:>20.1f} {l['ttft']:>7.2f} {l['per_chat']:>8.1f}", flush=True)
    if args.profile and "torch" in engines:
        from app.bench.step_profile import format_phases, format_profile, profile_steps, steady_decode, timed_phases

        engine = engines["torch"]
        for n in args.profile:
            ids = steady_decode(engine, chat_prompts(tokenizer_engine, n), args.new_tokens)
            phases = timed_phases(engine, steps=10)  # the native stack is one op: its own timers see inside
            print(f"{n} chats decoding: {format_phases(phases)}" if phases else
                  format_profile(n, profile_steps(engine, steps=10)), flush=True)
            for i in ids:
                engine.abort(i)
    return 0


def register(bench_sub) -> None:
    p = bench_sub.add_parser("throughput", help="aggregate tok/s of N concurrent chats vs llama.cpp")
    add_model_args(p)
    add_synthetic_args(p)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    p.add_argument("--backend", nargs="+", default=["torch", "llama.cpp"], choices=["torch", "llama.cpp"],
                   help="Ember runners to measure (the same scheduler drives both)")
    p.add_argument("--llamacpp-max", type=int, default=8,
                   help="llama-cpp-python serves at most this many chats per row (its aggregate is its one-stream speed)")
    p.add_argument("--profile", type=int, nargs="*", default=[16], metavar="N",
                   help="after the table, profile the torch runner's decode step at N chats "
                        "(GEMM / attention / other kernels / Python and dispatch); none: --profile")
    p.add_argument("--with-model", metavar="PATH",
                   help="a second model: the largest --concurrency split over both models, resident at once on "
                        "the server's engine thread, against all of it on the first model alone")
    p.add_argument("--rounds", type=int, default=3, help="with --with-model: rounds of each, alternated")
    p.set_defaults(func=run)
