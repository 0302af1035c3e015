"""`ember bench soak`: does a long day of chats leave the server bigger or slower?

A desktop engine runs for days from the tray, so memory that grows a little per request, or a
step that slows as the heap fragments, is a bug a short benchmark never shows. This runs
`--rounds` rounds against one real `ember serve` (`--backend torch` or `llama.cpp`): in each,
`--clients` concurrent clients send `--per-client` requests one after another, a fixed mix
(soak_mix.py) of prompt lengths, streamed and not, chat and completions, stop strings,
logprobs, and clients that hang up mid-stream. After each round it waits for the engine to go
idle (and to trim its heap, engine/service/allocator.py) and prints the server's RSS (also
before the trim, and split into heap / KV pool / file mappings), its heap figures (the status
route's `heap` field, which this bench turns on: live request objects, Python blocks, glibc's
in-use vs. free bytes), KV blocks in use, the round's tok/s and the server's CPU time per token
(what speed drift looks like on a machine other work also uses). At the end: RSS growth per
1,000 requests after `--warmup` rounds (a least-squares slope) and the end's speed against the
start's. It exits non-zero on errors, KV blocks or Sequence/_Request objects left at the end,
or growth above `--max-growth-mb`; speed is reported, not judged (too noisy on a shared box).
"""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

from app.bench.lib.readiness import heap_trims, settle
from app.bench.lib.stats import slope
from app.bench.soak_ab import compare_with_fresh
from app.bench.soak_mix import run_round

MiB = 1 << 20


def register(bench_sub) -> None:
    p = bench_sub.add_parser("soak", help="memory and speed over many rounds of mixed chats against a real server")
    p.add_argument("--model", help="a .gguf file (default: the bundled model)")
    p.add_argument("--backend", choices=("torch", "llama.cpp"), default="torch")
    p.add_argument("--rounds", type=int, default=24)
    p.add_argument("--clients", type=int, default=16, help="concurrent clients")
    p.add_argument("--per-client", type=int, default=8, help="requests each client sends per round, one after another")
    p.add_argument("--max-tokens", type=int, default=48, help="the longest reply; the mix asks for 1/3, 2/3 and all of it")
    p.add_argument("--prompt-scale", type=float, default=1.0,
                   help="length of the long prompts (1: ~200-token system prompt, ~90-token user turn)")
    p.add_argument("--warmup", type=int, default=3, help="rounds left out of the growth figure (caches filling)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--num-kv-blocks", type=int, default=None, help="default: the engine's own pool sizing")
    p.add_argument("--speculative", default=None, help="the server's --speculative (draft:PATH, ngram; default: off)")
    p.add_argument("--ab-pairs", type=int, default=4,
                   help="then paired rounds against a fresh server of the same settings (soak_ab.py; 0: none)")
    p.add_argument("--tracemalloc", action="store_true",
                   help="run the server under tracemalloc (slow) and print its top allocation sites")
    p.add_argument("--max-growth-mb", type=float, default=5.0, help="goal: RSS growth per 1,000 requests")
    p.add_argument("--json", dest="json_out", default=None, help="also write every round's figures here")
    p.set_defaults(func=run)


def rss_split(pid: int) -> dict | None:
    """The server's resident bytes by kind of mapping (Linux): `file` (code, the model's mmap),
    `kv` (anonymous mappings of 256 MiB or more: the torch runner's KV pool, llama.cpp's buffers),
    `anon` (the malloc heap, thread arenas, everything else). None where /proc has no smaps."""
    out = {"file": 0, "kv": 0, "anon": 0}
    kind = "anon"
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split(maxsplit=5)
                if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                    lo, hi = (int(x, 16) for x in head[0].split("-"))
                    path = head[5].strip() if len(head) > 5 else ""
                    kind = "file" if path.startswith("/") else "kv" if hi - lo >= 256 * MiB else "anon"
                elif head[0] == "Rss:":
                    out[kind] += int(head[1]) * 1024
    except OSError:
        return None
    return out


def _row(r: dict) -> str:
    h = r.get("heap") or {}
    obj, mal = h.get("objects", {}), h.get("malloc") or {}
    live = "/".join(str(obj.get(k, "-")) for k in ("Sequence", "_Request", "RequestOutput", "Job"))
    malloc = f"{mal['in_use'] / MiB:7.1f} {mal['free'] / MiB:6.1f}" if mal else f"{'-':>7s} {'-':>6s}"
    traced = h.get("tracemalloc", {}).get("current")
    py = f"{traced / MiB:7.1f}" if traced is not None else f"{h.get('py_allocated_blocks', 0) / 1000:6.0f}k"
    sp = r.get("rss_split") or {}
    split = "/".join(f"{sp[k] / MiB:.0f}" for k in ("anon", "kv", "file")) if sp else "-"
    return (f"{r['round']:5d} {r['requests']:6d} {r['errors']:4d} {r['hung_up']:5d} {r['tok_s']:7.1f} "
            f"{r['cpu_ms_per_token']:6.2f} "
            f"{r['rss'] / MiB:8.1f} {r['rss_delta'] / MiB:+7.1f} {split:>13s} {live:>11s} {py:>8s} {malloc} "
            f"{r['kv_used']:4d}/{r['kv_total']} {r['kv_cached_tokens']:7d}")


HEADER = ("round   reqs  err  hung   tok/s cpu ms/t  RSS MiB    ΔRSS anon/kv/file  seq/req/out/job  py   malloc used/free  KV used  cached tok")


def summarize(rounds: list[dict], warmup: int) -> dict:
    """Growth per 1,000 requests after warm-up, and throughput at the end against the start."""
    after = rounds[warmup:] if len(rounds) > warmup + 1 else rounds
    xs = [r["total_requests"] for r in after]
    growth = slope(xs, [r["rss"] for r in after]) * 1000 / MiB
    splits = [r.get("rss_split") for r in after]
    anon = slope(xs, [sp["anon"] for sp in splits]) * 1000 / MiB if all(splits) else None
    span = after[-1]["total_requests"] - after[0]["total_requests"]
    k = min(3, max(1, len(after) // 3))
    first, last = after[0]["tok_s"], after[-1]["tok_s"]
    head, tail = statistics.median(r["tok_s"] for r in after[:k]), statistics.median(r["tok_s"] for r in after[-k:])
    cpu_head = statistics.median(r["cpu_ms_per_token"] for r in after[:k])
    cpu_tail = statistics.median(r["cpu_ms_per_token"] for r in after[-k:])
    return {"requests": rounds[-1]["total_requests"], "errors": sum(r["errors"] for r in rounds),
            "rss_growth_mb_per_1k": round(growth, 2),
            "anon_growth_mb_per_1k": None if anon is None else round(anon, 2),
            "rss_net_mb_per_1k": round((after[-1]["rss"] - after[0]["rss"]) / MiB * 1000 / span, 2) if span else 0.0,
            "rss_first_mb": round(after[0]["rss"] / MiB, 1), "rss_last_mb": round(after[-1]["rss"] / MiB, 1),
            "tok_s_last_vs_first": round(last / first, 3) if first else 0.0,
            "tok_s_tail_vs_head": round(tail / head, 3) if head else 0.0, "median_window": k,
            "cpu_per_token_first_vs_last": round(cpu_head / cpu_tail, 3) if cpu_tail else 0.0,
            "kv_used_end": rounds[-1]["kv_used"],
            "trims": (rounds[-1].get("heap") or {}).get("trims"),
            "live_end": {k_: v for k_, v in (rounds[-1].get("heap") or {}).get("objects", {}).items()}}


def soak(args, log_path: Path) -> dict:
    import httpx
    import psutil

    from app.engine_process import EngineProcess, to_argv
    from engine.model_files.bundled import default_model_path

    os.environ["EMBER_DEBUG_HEAP"] = "1"  # the child inherits it: the status route's heap field
    if args.tracemalloc:
        os.environ["PYTHONTRACEMALLOC"] = "1"
    model = args.model or str(default_model_path())
    extra = to_argv({"max_num_seqs": max(args.clients, 16), "threads": args.threads,
                     "num_kv_blocks": args.num_kv_blocks, "speculative": args.speculative})
    argv = ["--model", model, "--backend", args.backend, *extra]
    proc = EngineProcess(argv, api_key=secrets.token_urlsafe(16), log_path=log_path)
    rounds: list[dict] = []
    ab = None
    with proc.start(timeout=600), httpx.Client() as http:
        server = psutil.Process(proc.pid)
        base, headers = proc.base_url, proc.headers
        s = settle(http, base, headers)
        rss0, total = server.memory_info().rss, 0
        print(f"  {args.backend}: ready, RSS {rss0 / MiB:.1f} MiB, KV pool {s['kv']['blocks_total']} blocks",
              flush=True)
        print(HEADER, flush=True)
        for i in range(args.rounds):
            cpu0, trims = sum(server.cpu_times()[:2]), heap_trims(s)
            res = asyncio.run(run_round(base, headers, i, args.clients, args.per_client, args.max_tokens,
                                        args.prompt_scale))
            cpu = sum(server.cpu_times()[:2]) - cpu0  # the server's own CPU: robust to a busy machine
            s = settle(http, base, headers, trims)
            total += res["requests"]
            rss = server.memory_info().rss
            r = {"round": i, **res, "cpu_ms_per_token": round(1000 * cpu / max(res["tokens"], 1), 2),
                 "total_requests": total, "rss": rss, "rss_split": rss_split(proc.pid),
                 "rss_delta": rss - (rounds[-1]["rss"] if rounds else rss0), "kv_used": s["kv"]["blocks_used"],
                 "kv_total": s["kv"]["blocks_total"],
                 "kv_cached_tokens": s["kv"]["tokens_cached"], "num_requests": s["num_requests"], "heap": s.get("heap")}
            rounds.append(r)
            print(_row(r), flush=True)
            if args.json_out:  # after every round: a run cut short still has its figures
                Path(args.json_out).write_text(json.dumps({"backend": args.backend, "rounds": rounds}, default=str))
            for e in res["error_samples"]:
                print(f"        error: {e}", file=sys.stderr, flush=True)
        if args.ab_pairs:
            print(f"  the soaked server against a fresh one ({args.warmup} warm-up rounds, "
                  f"{args.ab_pairs} pairs in ABBA order):", flush=True)
            ab = compare_with_fresh(argv, http, (base, headers), args, args.rounds, log_path)
        if args.tracemalloc and rounds[-1].get("heap", {}).get("tracemalloc"):
            print("  what grew most since the first round (tracemalloc):\n    "
                  + "\n    ".join(rounds[-1]["heap"]["tracemalloc"]["growth"]))
    return {"backend": args.backend, "model": Path(model).name, "rounds": rounds,
            "summary": summarize(rounds, args.warmup), "ab": ab}


def report(res: dict, args) -> bool:
    s = res["summary"]
    live = s["live_end"]
    leaked = live.get("Sequence", 0) + live.get("_Request", 0)
    ok = {f"RSS growth after warm-up ≤ {args.max_growth_mb:g} MB per 1,000 requests":
          s["rss_growth_mb_per_1k"] <= args.max_growth_mb,
          "no errors": s["errors"] == 0, "KV pool empty at the end": s["kv_used_end"] == 0,
          "no live Sequence/_Request at the end": leaked == 0,
          "last round's tok/s within 3% of the first's": abs(s["tok_s_last_vs_first"] - 1) <= 0.03,
          "server CPU per token at the end within 3% of the start's (speed, robust to other load)":
          s["cpu_per_token_first_vs_last"] >= 0.97}
    print(f"\n{res['backend']}: {s['requests']} requests, {s['errors']} errors; RSS {s['rss_first_mb']} -> "
          f"{s['rss_last_mb']} MiB after warm-up: {s['rss_growth_mb_per_1k']:+.2f} MiB per 1,000 requests "
          f"(slope; end to end {s['rss_net_mb_per_1k']:+.2f}; outside the KV pool "
          f"{s['anon_growth_mb_per_1k'] if s['anon_growth_mb_per_1k'] is not None else '-'}); tok/s last/first round {s['tok_s_last_vs_first']:.3f}, "
          f"median of last {s['median_window']} / first {s['median_window']} {s['tok_s_tail_vs_head']:.3f}; server CPU "
          f"per token, first {s['median_window']} / last {s['median_window']} rounds {s['cpu_per_token_first_vs_last']:.3f}; "
          f"KV blocks in use at the end {s['kv_used_end']}; idle heap trims {s['trims']}; live at the end {live}")
    if res["ab"]:
        ab = res["ab"]
        print(f"soaked / fresh server tok/s over {len(ab['pairs'])} paired rounds: median {ab['ratio_median']:.3f} "
              f"(range {ab['ratio_min']:.3f}-{ab['ratio_max']:.3f})")
        ok["soaked server's tok/s within 3% of a fresh one's (median of paired rounds)"] = \
            abs(ab["ratio_median"] - 1) <= 0.03
    for goal, met in ok.items():
        print(f"  [{'ok' if met else 'MISSED'}] {goal}")
    return all(v for k, v in ok.items() if "tok/s" not in k and "CPU" not in k)  # speed: reported, noisy


def run(args) -> int:
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    log_path = Path(tempfile.gettempdir()) / f"ember-bench-soak-{args.backend}-{int(time.time())}-{os.getpid()}.log"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"ember bench soak: --backend {args.backend}, {args.rounds} rounds × {args.clients} clients × "
          f"{args.per_client} requests, up to {args.max_tokens} tokens, prompt scale {args.prompt_scale:g}, "
          f"speculative {args.speculative or 'off'}; MALLOC_ARENA_MAX="
          f"{os.environ.get('MALLOC_ARENA_MAX', 'unset')}, EMBER_MALLOC_TRIM_IDLE_S={os.environ.get('EMBER_MALLOC_TRIM_IDLE_S', 'unset (0.5)')}; "
          f"load average {load:.1f} on {os.cpu_count()} CPUs; engine log {log_path}", flush=True)
    try:
        res = soak(args, log_path)
    except (RuntimeError, TimeoutError) as e:
        print(f"  {args.backend}: failed: {e}", file=sys.stderr)
        return 1
    ok = report(res, args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res, indent=2, default=str))
    return 0 if ok else 1
