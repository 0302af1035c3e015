"""`ember bench restart`: time to first token of one more turn after the engine stopped and
started again, with the prefix cache's disk tier (engine/kv_disk/) and without it.

Per chat length and run: an engine computes the chat (its blocks go to a fresh disk folder) and
stops; a new engine then answers the chat plus one more user turn twice, once without the tier
(everything computed again) and once reading the tier. The figures are medians; the replies'
greedy tokens must be the same. Memory: a fresh process answers one chat's next turn from a tier that
holds that chat alone and from one that holds `--memory-chats` chats: its peak RSS must not grow
with the tier's size (the blocks are read into the KV pool, not kept). `--backend torch` (the default): Ember's engine and its block
files; `--backend llama.cpp`: the llama.cpp runner's saved slot states (engine/backends/slot_disk.py).
"""
from __future__ import annotations

import shutil
import statistics
import tempfile
import time

from app.bench import add_model_args

TURN = " And one more question: what did we say first?"


def first_token(args, prompt: list[int], disk: str | None) -> tuple[float, list[int], int]:
    """(seconds to the first token, the greedy reply, tokens that came from a cache) on a new engine."""
    from engine.backends import load_engine
    from engine.config import EngineConfig
    from engine.model_files.bundled import default_model_path
    from engine.sampling_params import SamplingParams

    engine, _ = load_engine(EngineConfig(model_path=args.model or str(default_model_path()), dtype=args.dtype,
                                         weights=args.weights, kv_cache_dtype=args.kv_cache_dtype,
                                         num_threads=args.threads, max_model_len=args.context,
                                         kv_disk_dir=disk, mmproj=args.mmproj), args.backend, args.device)
    try:
        started, first = time.perf_counter(), None
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=args.reply, ignore_eos=True), "turn")
        while engine.has_unfinished():
            for out in engine.step():
                if first is None and out.output_token_ids:
                    first = time.perf_counter() - started
                if out.finished:
                    return first, out.output_token_ids, out.num_cached_tokens
    finally:
        engine.close()
    raise RuntimeError("the request ended without an output")


def one_length(args, n: int) -> tuple[float, float, bool, int]:
    from app.bench.lib.workloads import make_prompt
    from engine.loaders.tokenizer import load_tokenizer
    from engine.model_files.bundled import default_model_path

    encode = load_tokenizer(args.model or str(default_model_path())).encode
    chat = make_prompt(encode, n)
    turn = chat + encode(TURN)
    cold, warm, same, cached = [], [], True, 0
    for _ in range(args.runs):
        folder = tempfile.mkdtemp(prefix="ember-bench-restart-")
        try:
            first_token(args, chat, folder)  # yesterday's chat, its blocks written as it ran
            t_cold, reply_cold, _ = first_token(args, turn, None)
            t_warm, reply_warm, cached = first_token(args, turn, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        cold.append(t_cold)
        warm.append(t_warm)
        same &= reply_cold == reply_warm
    return statistics.median(cold), statistics.median(warm), same, cached


ENGINE_FIELDS = ("model", "dtype", "weights", "kv_cache_dtype", "threads", "context", "mmproj", "backend", "device", "reply")


def peak_rss_child(job: dict) -> None:
    """A fresh process's part (`python -c`): answer the prompt reading the tier, then print its
    peak RSS (VmHWM) and the tokens that came from disk."""
    import argparse

    _, _, cached = first_token(argparse.Namespace(**job["args"]), job["prompt"], job["disk"])
    status = dict(line.split(":", 1) for line in open("/proc/self/status", encoding="ascii"))
    print(int(status["VmHWM"].split()[0]) * 1024, cached)


def memory_round(args, n: int) -> list[tuple[int, int, int, int]]:
    """(chats kept, the tier's bytes, the reader's peak RSS, tokens from disk) for a tier of one
    chat of `n` tokens and for one of `--memory-chats` such chats (each with its own first line).
    The reader is a plain child process (not multiprocessing's spawn, whose resource tracker
    would outlive it), so its RSS is its own."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from app.bench.lib.workloads import make_prompt
    from engine.loaders.tokenizer import load_tokenizer
    from engine.model_files.bundled import default_model_path

    encode = load_tokenizer(args.model or str(default_model_path())).encode
    chat, rows = make_prompt(encode, n), []
    for kept in sorted({1, args.memory_chats}):
        folder = tempfile.mkdtemp(prefix="ember-bench-restart-")
        try:
            for i in range(kept):  # chat 0 is the one read back
                first_token(args, (encode(f"Chat {i}. ") + chat)[:n], folder)
            size = sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())
            job = {"args": {k: getattr(args, k) for k in ENGINE_FIELDS}, "disk": folder,
                   "prompt": (encode("Chat 0. ") + chat)[:n] + encode(TURN)}
            out = subprocess.run([sys.executable, "-c", "import json, sys; from app.bench.restart import "
                                  "peak_rss_child; peak_rss_child(json.loads(sys.argv[1]))", json.dumps(job)],
                                 capture_output=True, text=True, check=True)
            peak, cached = map(int, out.stdout.split()[-2:])
            rows.append((kept, size, peak, cached))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return rows


def run(args) -> int:
    print(f"model {args.model or 'bundled'} on {args.backend}, {args.threads} threads, median of {args.runs} runs")
    print(f"{'chat tokens':>12}{'TTFT without (s)':>18}{'with disk tier (s)':>20}{'speed-up':>10}"
          f"{'from disk':>11}  replies")
    for n in args.tokens:
        cold, warm, same, cached = one_length(args, n)
        print(f"{n:>12}{cold:>18.3f}{warm:>20.3f}{cold / warm:>9.1f}x{cached:>11}  "
              f"{'identical' if same else 'DIFFER'}")
    if args.memory_chats:
        n = min(args.tokens)
        print(f"memory, a fresh process answering a {n}-token chat's next turn from the tier:")
        print(f"{'chats kept':>12}{'tier on disk (KiB)':>20}{'peak RSS (MiB)':>16}{'from disk':>11}")
        for kept, size, peak, cached in memory_round(args, n):
            print(f"{kept:>12}{size / 2**10:>20.0f}{peak / 2**20:>16.1f}{cached:>11}")
    return 0


def register(bench_sub) -> None:
    p = bench_sub.add_parser("restart", help="time to first token after an engine restart, with the KV disk "
                                             "tier and without")
    add_model_args(p, backend="torch")
    p.add_argument("--tokens", type=int, nargs="+", default=[1000, 4000], help="chat lengths")
    p.add_argument("--context", type=int, default=8192, help="the engine's context")
    p.add_argument("--reply", type=int, default=16, help="greedy tokens of the new turn's reply")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--memory-chats", type=int, default=8,
                   help="the larger tier of the memory round, in chats of the shortest length (0: no memory round)")
    p.set_defaults(func=run)
