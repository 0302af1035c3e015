"""`ember bench server`: aggregate tok/s and time to first token over HTTP at 1, 4 and 16
concurrent streaming clients, the torch runner and the llama.cpp runner side by side in one run.

Each backend gets its own `python -m engine serve --backend X` process (the real server, SSE and
all); every client streams one chat completion of exactly `--max-tokens` tokens (`ignore_eos`),
so the backends do the same work. TTFT is measured at the client, from sending the request to
the first content chunk.

`--llama-server BIN` adds llama.cpp's own server (a `llama-server` binary built from llama.cpp,
which llama-cpp-python does not ship) to the same run: one slot per client (`-np`), the same
threads and the same chat requests, so the peer's continuous batching is measured side by side.
"""
from __future__ import annotations

import asyncio
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

from app.bench.lib.http_chat import stream_chat
from app.bench.lib.processes import llama_server


def register(bench_sub) -> None:
    p = bench_sub.add_parser("server", help="HTTP server: tok/s and TTFT at 1/4/16 clients, torch vs llama.cpp")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--model", help="a .gguf file (default: the bundled model)")
    g.add_argument("--model-id", help="a model id from the store")
    p.add_argument("--models-dir", default=None)
    p.add_argument("--backends", default="torch,llama.cpp", help="comma-separated")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=None,
                   help="kernel threads per engine; on a busy machine 1 beats spinning thread barriers")
    from engine.backends.cli_args import add_backend_args
    add_backend_args(p, backend=False)  # --device, --dtype; --backends names the backends
    p.add_argument("--json", dest="json_out", default=None, help="also write the results here")
    p.add_argument("--llama-server", default=None, metavar="BIN",
                   help="also measure llama.cpp's own server (path to a llama-server binary), slots = max clients")
    p.add_argument("--ctx-per-slot", type=int, default=1024, help="llama-server context per slot")
    p.set_defaults(func=run)


async def _round(base_url: str, headers: dict, clients: int, max_tokens: int) -> dict:
    import httpx

    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=httpx.Timeout(600),
                                 limits=httpx.Limits(max_connections=clients + 2)) as http:
        t0 = time.perf_counter()
        rs = await asyncio.gather(*[stream_chat(http, i, max_tokens) for i in range(clients)])
        wall = time.perf_counter() - t0
    ttfts = sorted(r["ttft"] for r in rs)
    tokens = sum(r["tokens"] for r in rs)
    return {"clients": clients, "tokens": tokens, "wall_s": round(wall, 3),
            "agg_tok_s": round(tokens / wall, 1), "ttft_p50_s": round(statistics.median(ttfts), 3),
            "ttft_max_s": round(ttfts[-1], 3),
            "stream_tok_s": round(statistics.mean(r["stream_tok_s"] for r in rs), 1)}


def _rounds(name: str, base_url: str, headers: dict, conc: list[int], max_tokens: int) -> list[dict]:
    """A warm-up request, then one round per client count, each printed as it ends."""
    asyncio.run(_round(base_url, headers, 1, 8))
    rounds = []
    for c in conc:
        r = asyncio.run(_round(base_url, headers, c, max_tokens))
        print(f"  {name:12s} {c:3d} clients: {r['agg_tok_s']:7.1f} tok/s in all, "
              f"TTFT p50 {r['ttft_p50_s'] * 1000:6.0f} ms (max {r['ttft_max_s'] * 1000:6.0f}), "
              f"{r['stream_tok_s']:6.1f} tok/s per stream", flush=True)
        rounds.append(r)
    return rounds


def bench_backend(backend: str, model_args: list[str], conc: list[int], max_tokens: int, extra: list[str],
                  log_path: Path) -> dict:
    from app.engine_process import EngineProcess

    key = secrets.token_urlsafe(16)
    proc = EngineProcess([*model_args, "--backend", backend, *extra], api_key=key, log_path=log_path)
    t0 = time.perf_counter()
    with proc.start(timeout=600):
        health = proc.health()
        load_s = time.perf_counter() - t0
        rounds = _rounds(backend, proc.base_url, proc.headers, conc, max_tokens)
    return {"backend": backend, "device": health.get("device"), "model": health.get("model"),
            "startup_s": round(load_s, 1), "rounds": rounds}


def bench_llama_server(binary: str, model: str, conc: list[int], max_tokens: int, threads: int | None,
                       ctx_per_slot: int, log_path: Path) -> dict:
    """llama.cpp's server with one slot per client, driven by the same clients as Ember's."""
    slots = max(conc)
    t0 = time.perf_counter()
    with llama_server(binary, model, slots, slots * ctx_per_slot, threads, log_path) as (_, base):
        load_s = time.perf_counter() - t0
        rounds = _rounds("llama-server", base, {}, conc, max_tokens)
    return {"backend": "llama-server", "device": "cpu", "model": Path(model).name,
            "startup_s": round(load_s, 1), "rounds": rounds}


def engine_flags(args, max_num_seqs: int) -> list[str]:
    """The served engine's flags from the bench's own (its --mmproj too: the projector loads)."""
    from app.engine_process import to_argv

    return to_argv({"dtype": args.dtype, "weights": args.weights, "kv_cache_dtype": args.kv_cache_dtype,
                    "device": args.device, "mmproj": args.mmproj, "max_num_seqs": max_num_seqs,
                    "threads": args.threads})


def run(args) -> int:
    import logging
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    if args.model:
        model_args = ["--model", args.model]
    elif args.model_id:
        model_args = ["--model-id", args.model_id] + (["--models-dir", args.models_dir] if args.models_dir else [])
    else:
        from engine.model_files.bundled import default_model_path
        model_args = ["--model", str(default_model_path())]
    conc = [int(c) for c in args.concurrency.split(",") if c.strip()]
    extra = engine_flags(args, max(conc + [16]))
    log_path = Path(tempfile.gettempdir()) / f"ember-bench-server-{int(time.time())}.log"
    import os
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"ember bench server: {' '.join(model_args)}; {args.max_tokens} tokens per client; "
          f"threads {args.threads or 'default'}; load average {load:.1f} on {os.cpu_count()} CPUs "
          f"(other processes skew the figures); engine logs in {log_path}", flush=True)
    results = []
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        try:
            results.append(bench_backend(backend, model_args, conc, args.max_tokens, extra, log_path))
        except (RuntimeError, TimeoutError) as e:
            print(f"  {backend}: failed: {e}", file=sys.stderr)
            results.append({"backend": backend, "error": str(e)})
    if args.llama_server:
        if "--model" not in model_args:
            print("  llama-server: needs --model FILE (or the default model), not --model-id", file=sys.stderr)
        else:
            try:
                results.append(bench_llama_server(args.llama_server, model_args[1], conc, args.max_tokens,
                                                  args.threads, args.ctx_per_slot, log_path))
            except (RuntimeError, TimeoutError, OSError) as e:
                print(f"  llama-server: failed: {e}", file=sys.stderr)
                results.append({"backend": "llama-server", "error": str(e)})
    _table(results)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))
    return 0 if all("error" not in r for r in results) else 1


def _table(results: list[dict]) -> None:
    print("\nbackend    device clients  agg tok/s  TTFT p50 ms  TTFT max ms  tok/s/stream")
    for res in results:
        for r in res.get("rounds", []):
            print(f"{res['backend']:10s} {res['device'] or '-':6s} {r['clients']:7d} {r['agg_tok_s']:10.1f} "
                  f"{r['ttft_p50_s'] * 1000:12.0f} {r['ttft_max_s'] * 1000:12.0f} {r['stream_tok_s']:13.1f}")
