"""`ember bench footprint`: resident memory of the engine process idle, while chats hold their KV,
and after they finish, for each Ember backend and llama.cpp's own server side by side in one run.

Each target is the real server on the same model with the same slots and context: Ember's engine
process (`--max-num-seqs SLOTS --max-model-len CTX`, so its pool is SLOTS × CTX tokens) and, with
`--llama-server BIN`, `llama-server -np SLOTS -c SLOTS×CTX`. For each: RSS once healthy (idle),
the peak RSS while `--chats` streaming chats each hold `--chat-tokens` tokens (prompt + reply,
`ignore_eos`), RSS after they finish, and the CPU the idle process uses. The figures it prints
against the issue's goals: idle against llama-server's, and the peak against the weights plus the
KV those live tokens need (the engine's own per-token rule). `--gui` also measures the desktop
app (GUI process and its engine) idle CPU.
"""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
import tempfile
import threading
import time
from pathlib import Path

from app.bench.lib.http_chat import stream_chat
from app.bench.lib.processes import llama_server, stop_process

MiB = 1 << 20


def register(bench_sub) -> None:
    p = bench_sub.add_parser("footprint", help="memory: idle, with chats held and after, torch vs llama.cpp vs llama-server")
    p.add_argument("--model", help="a .gguf file (default: the bundled model)")
    p.add_argument("--backends", default="torch,llama.cpp", help="comma-separated Ember backends")
    p.add_argument("--slots", type=int, default=16, help="parallel chats the servers are set up for")
    p.add_argument("--ctx", type=int, default=1024, help="context per chat (tokens)")
    p.add_argument("--chats", type=int, default=16, help="chats held at once under load")
    p.add_argument("--chat-tokens", type=int, default=512, help="tokens each chat holds (prompt + reply)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--idle-seconds", type=float, default=10.0, help="window for the idle CPU figure")
    p.add_argument("--llama-server", default=None, metavar="BIN", help="also measure llama.cpp's server (`make llama-server`)")
    p.add_argument("--gui", action="store_true", help="also measure the desktop app's idle CPU (GUI + engine)")
    p.add_argument("--json", dest="json_out", default=None, help="also write the results here")
    p.set_defaults(func=run)


class PeakRss:
    """Samples a process's RSS every 50 ms on a thread; `peak` is the largest seen (a transient,
    such as llama.cpp's context being re-created, counts)."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.proc, self.peak, self._stop = psutil.Process(pid), 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.05)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def cpu_percent(pids: list[int], seconds: float) -> dict[int, float]:
    """CPU time each process uses over `seconds` (user + system), as a percentage of one core."""
    import psutil

    procs = [psutil.Process(p) for p in pids]
    before = [sum(p.cpu_times()[:2]) for p in procs]
    time.sleep(seconds)
    return {p.pid: 100.0 * (sum(p.cpu_times()[:2]) - b) / seconds for p, b in zip(procs, before)}


def _prompt_tokens(base: str, headers: dict) -> int:
    """How many tokens the bench's chat prompt takes (its template included), from the server's usage."""
    import httpx

    body = {"messages": [{"role": "user", "content": "Write a long story about a fox (#0)."}], "max_tokens": 1}
    r = httpx.post(base + "/v1/chat/completions", json=body, headers=headers, timeout=120)
    r.raise_for_status()
    return int(r.json()["usage"]["prompt_tokens"])


async def _held_round(base: str, headers: dict, chats: int, max_tokens: int, proc) -> tuple[int, int]:
    """`chats` streaming chats at once; returns the RSS when the first one ends (every chat then
    holds its tokens) and the tokens generated in all."""
    import httpx

    held: list[int] = []

    async def chat(http, i: int) -> int:
        r = await stream_chat(http, i, max_tokens)
        if not held:
            held.append(proc.memory_info().rss)
        return r["tokens"]

    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=httpx.Timeout(1800),
                                 limits=httpx.Limits(max_connections=chats + 2)) as http:
        tokens = await asyncio.gather(*[chat(http, i) for i in range(chats)])
    return held[0], sum(tokens)


def measure(name: str, pid: int, base: str, headers: dict, args) -> dict:
    """Idle RSS, peak RSS under load, RSS after, idle CPU of one healthy server process."""
    import psutil

    proc = psutil.Process(pid)
    time.sleep(2.0)
    idle = proc.memory_info().rss
    idle_cpu = cpu_percent([pid], args.idle_seconds)[pid]
    prompt = _prompt_tokens(base, headers)
    reply = max(1, args.chat_tokens - prompt)
    t0 = time.perf_counter()
    with PeakRss(pid) as peak:
        held, tokens = asyncio.run(_held_round(base, headers, args.chats, reply, proc))
    tok_s = round(tokens / (time.perf_counter() - t0), 1)
    time.sleep(2.0)
    after = proc.memory_info().rss
    res = {"target": name, "idle_rss": idle, "held_rss": held, "peak_rss": peak.peak, "after_rss": after,
           "idle_cpu_pct": round(idle_cpu, 2), "live_tokens": args.chats * prompt + tokens, "agg_tok_s": tok_s}
    print(f"  {name:12s} idle {idle / MiB:7.1f} MiB, {args.chats} chats held {held / MiB:7.1f} MiB "
          f"(peak {peak.peak / MiB:.1f}), after {after / MiB:7.1f} MiB; idle CPU {idle_cpu:.2f}% of a core "
          f"({res['live_tokens']} live tokens, {tok_s} tok/s)", flush=True)
    return res


def bench_ember(backend: str, model: str, args, log_path: Path) -> dict:
    from app.engine_process import EngineProcess, to_argv

    key = secrets.token_urlsafe(16)
    extra = to_argv({"backend": backend, "max_num_seqs": args.slots, "max_model_len": args.ctx,
                     "threads": args.threads})
    proc = EngineProcess(["--model", model, *extra], api_key=key, log_path=log_path)
    with proc.start(timeout=600):
        decision = proc.health().get("decision") or {}
        res = measure(backend, proc.pid, proc.base_url, proc.headers, args)
    # the KV element the engine keeps: llama.cpp f16; torch its dtype
    res["kv_itemsize"] = 2 if backend == "llama.cpp" or decision.get("dtype") != "float32" else 4
    return res


def bench_llama_server(binary: str, model: str, args, log_path: Path) -> dict:
    with llama_server(binary, model, args.slots, args.slots * args.ctx, args.threads, log_path,
                      ("--kv-unified",)) as (proc, base):
        res = measure("llama-server", proc.pid, base, {}, args)
    res["kv_itemsize"] = 2
    return res


def bench_gui(args) -> dict:
    """The desktop app offscreen in a fresh EMBER_HOME: once its engine is up and both settle,
    the CPU the GUI process and its engine use together."""
    import subprocess

    import psutil

    from app.frozen import ember_command

    home = tempfile.mkdtemp(prefix="ember-footprint-gui-")
    env = dict(os.environ, EMBER_HOME=home, QT_QPA_PLATFORM="offscreen", EMBER_SERVER_PORT="0")
    gui = subprocess.Popen(ember_command(), env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t0, pids = time.perf_counter(), [gui.pid]
        while time.perf_counter() - t0 < 300:  # the engine child is up and the pair has settled
            kids = psutil.Process(gui.pid).children(recursive=True)
            pids = [gui.pid] + [k.pid for k in kids]
            if kids and max(k.memory_info().rss for k in kids) > 150 * MiB and sum(cpu_percent(pids, 3.0).values()) < 5:
                break
        cpu = cpu_percent(pids, max(args.idle_seconds, 30.0))
        rss = {p: psutil.Process(p).memory_info().rss for p in pids}
    finally:
        stop_process(gui, grace=20.0)
    engine_cpu = sum(v for p, v in cpu.items() if p != gui.pid)
    print(f"  desktop app  GUI + engine idle CPU {sum(cpu.values()):.2f}% of a core (GUI {cpu[gui.pid]:.2f}%, "
          f"engine {engine_cpu:.2f}%); RSS GUI {rss[gui.pid] / MiB:.1f} MiB, "
          f"engine {sum(v for p, v in rss.items() if p != gui.pid) / MiB:.1f} MiB", flush=True)
    return {"target": "desktop app", "idle_cpu_pct": round(sum(cpu.values()), 2), "cpu_pct": cpu, "rss": rss}


def _report(results: list[dict], weights: int, per_token: dict[int, int]) -> None:
    peer = next((r for r in results if r.get("target") == "llama-server" and "idle_rss" in r), None)
    print("\ntarget        idle MiB  held MiB  peak MiB  after MiB  weights+live KV MiB  held/(w+KV)  "
          "(held-idle)/KV  idle/llama-server")
    for r in results:
        if "idle_rss" not in r:
            continue
        kv = r["live_tokens"] * per_token[r["kv_itemsize"]]
        vs = f"{r['idle_rss'] / peer['idle_rss']:.2f}x" if peer else "-"
        print(f"{r['target']:12s} {r['idle_rss'] / MiB:9.1f} {r['held_rss'] / MiB:9.1f} {r['peak_rss'] / MiB:9.1f} "
              f"{r['after_rss'] / MiB:10.1f} {(weights + kv) / MiB:20.1f} {r['held_rss'] / (weights + kv):11.2f}x "
              f"{(r['held_rss'] - r['idle_rss']) / kv:14.2f}x {vs:>18s}")
    print("goals: idle within 1.5x of llama-server's; held within 1.2x of weights + live KV; idle CPU < 1%")


def run(args) -> int:
    import logging

    from engine.backends.device import model_footprint
    from engine.model_files.bundled import default_model_path

    logging.getLogger("httpx").setLevel(logging.WARNING)
    model = args.model or str(default_model_path())
    fp = model_footprint(model)
    per_token = {n: fp.kv_bytes_per_token(n) for n in (2, 4)}
    log_path = Path(tempfile.gettempdir()) / f"ember-bench-footprint-{int(time.time())}.log"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"ember bench footprint: {Path(model).name} (weights {fp.weights_bytes / MiB:.1f} MiB, "
          f"KV {per_token[2] // 1024} KiB/token f16); {args.slots} slots × {args.ctx} tokens; "
          f"{args.chats} chats × {args.chat_tokens} tokens; load average {load:.1f} on {os.cpu_count()} CPUs; "
          f"logs in {log_path}", flush=True)
    results = []
    targets = [(b, lambda b=b: bench_ember(b, model, args, log_path)) for b in args.backends.split(",") if b.strip()]
    if args.llama_server:
        targets.append(("llama-server", lambda: bench_llama_server(args.llama_server, model, args, log_path)))
    if args.gui:
        targets.append(("desktop app", lambda: bench_gui(args)))
    for name, fn in targets:
        try:
            results.append(fn())
        except (RuntimeError, TimeoutError, OSError) as e:
            print(f"  {name}: failed: {e}", file=sys.stderr)
            results.append({"target": name, "error": str(e)})
    _report(results, fp.weights_bytes, per_token)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))
    return 0 if all("error" not in r for r in results) else 1
