"""`ember bench spec`: speculative decoding against plain decoding, the same engine and prompts, one run.

Four kinds of work (a chat question, rewriting a given function, extraction from a long input,
an open-ended story), each at 1 and 4 concurrent chats, greedy, for each drafter (off, prompt
lookup, a draft model); the engines live side by side and take turns per kind, so machine noise
hits them alike. Decode tok/s per chat = (tokens − 1) / (last token − first token): prefill is
the same work with or without drafts and is left out. With `--llama-server BIN` (and a draft
model) llama.cpp's own server runs the same prompts plain, with its n-gram lookup and with `-md`.
"""
from __future__ import annotations

import asyncio
import inspect
import statistics
import time

from app.bench import add_model_args

QUESTIONS = ["Explain how a hash map works.", "Why is the sky blue?", "Give three tips for learning Python.",
             "What is a prime number?"]
STORIES = ["a fox who learns to sail", "a lighthouse keeper and a storm", "a robot that grows tomatoes",
           "two rival bakers in a small town"]


def _sources() -> list[str]:
    """Real functions to rewrite and long inputs to extract from: Ember's own code (always installed)."""
    from engine import block_manager, scheduler
    from engine.sampling import sampler
    from engine.speculative import ngram

    funcs = [sampler.truncate, ngram.NgramDrafter.lookup, block_manager.BlockManager.append_slots,
             scheduler.Scheduler.add]
    return [inspect.getsource(f) for f in funcs], [inspect.getsource(m) for m in (block_manager, scheduler)]


def messages(kind: str, i: int) -> list[dict]:
    funcs, modules = _sources()
    if kind == "chat":
        text = QUESTIONS[i % len(QUESTIONS)]
    elif kind == "code":
        text = ("Rewrite this Python function with clearer variable names and a docstring; keep its "
                f"behaviour exactly. Reply with the whole function.\n\n```python\n{funcs[i % len(funcs)]}```")
    elif kind == "extract":
        text = (f"```python\n{modules[i % len(modules)][:6000]}```\n\nList every method defined above with "
                "its full signature, one per line, exactly as written.")
    else:
        text = f"Write a long story about {STORIES[i % len(STORIES)]}."
    return [{"role": "user", "content": text}]


KINDS = ("chat", "code", "extract", "story")


def register(bench_sub) -> None:
    p = bench_sub.add_parser("spec", help="speculative decoding vs plain: speedup, acceptance, per drafter")
    add_model_args(p, backend="torch", no_images="speculative decoding is measured on Ember's torch engine, "
                                                 "which has no image path (a projector runs on llama.cpp)")
    p.add_argument("--draft", default=None, metavar="GGUF", help="a draft model of the same vocabulary")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    p.add_argument("--runs", type=int, default=3, help="rounds of every (kind, chats) cell, each drafter run "
                   "right after `off` on the same prompts; the median speedup and its spread over the rounds")
    p.add_argument("--llama-server", default=None, metavar="BIN",
                   help="also llama.cpp's server: plain, --spec-type ngram-simple, and -md DRAFT")
    p.set_defaults(func=run)


def _run_ember(engine, prompts: list[list[int]], max_tokens: int) -> dict:
    from engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    before = engine.stats().spec
    ids = [engine.add_request(p, params) for p in prompts]
    first, last, count = {}, {}, {i: 0 for i in ids}
    while engine.has_unfinished():
        for o in engine.step():
            now = time.perf_counter()
            first.setdefault(o.request_id, now)
            last[o.request_id] = now
            count[o.request_id] += len(o.new_token_ids)
    rates = [(count[i] - 1) / (last[i] - first[i]) for i in ids if count[i] > 1 and last[i] > first[i]]
    t0, t1 = max(first.values()), max(last.values())
    agg = sum(count.values()) / (t1 - min(first.values())) if t1 > t0 else float("nan")
    out = {"tok_s": statistics.median(rates) if rates else float("nan"), "agg": agg}
    after = engine.stats().spec
    if after is not None:
        proposed = after.num_proposed - (before.num_proposed if before else 0)
        accepted = after.num_accepted - (before.num_accepted if before else 0)
        passes = after.num_passes - (before.num_passes if before else 0)
        out.update(accept=accepted / proposed if proposed else None, k=proposed / passes if passes else 0.0)
    return out


async def _llama_round(base: str, msgs: list[list[dict]], max_tokens: int) -> dict:
    import httpx

    async def one(http, m):
        r = await http.post("/v1/chat/completions", json={"messages": m, "max_tokens": max_tokens,
                                                         "temperature": 0.0})
        r.raise_for_status()
        t = r.json().get("timings", {})
        return t.get("predicted_per_second", float("nan")), t.get("draft_n", 0), t.get("draft_n_accepted", 0)

    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(900)) as http:
        rs = await asyncio.gather(*[one(http, m) for m in msgs])
    drafted, accepted = sum(r[1] for r in rs), sum(r[2] for r in rs)
    return {"tok_s": statistics.median(r[0] for r in rs), "accept": accepted / drafted if drafted else None}


def run(args) -> int:
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.model_files.bundled import default_model_path
    from engine.sampling_params import SamplingParams

    model = args.model or str(default_model_path())
    drafters = ["off", "ngram"] + ([f"draft:{args.draft}"] if args.draft else [])
    engines = {}
    for d in drafters:
        cfg = EngineConfig(model_path=model, dtype=args.dtype, weights=args.weights, speculative=d,
                           num_threads=args.threads, max_model_len=4096, num_kv_blocks=1024)
        engines[d] = LLMEngine(cfg)
        engines[d].generate(["Hello"], SamplingParams(max_tokens=4))  # warm-up
    tmpl, tok = engines["off"].chat_template, engines["off"].tokenizer
    print(f"model {model}" + (f", draft {args.draft}" if args.draft else "") + f", {args.threads} threads, "
          f"greedy, {args.max_tokens} new tokens at most; decode tok/s per chat (median), speedup vs off")
    cells: dict[tuple, list[dict]] = {}
    for _ in range(args.runs):
        for kind in args.kinds:
            for c in args.concurrency:
                prompts = [tok.encode(tmpl.render(messages(kind, i), add_generation_prompt=True)) for i in range(c)]
                for d in drafters:
                    cells.setdefault((kind, c, d), []).append(_run_ember(engines[d], prompts, args.max_tokens))
    _print_costs(engines)
    for e in engines.values():
        e.close()
    rows = []
    for (kind, c, d), rs in cells.items():
        off = cells[(kind, c, "off")]
        spread = {key: _ratios(rs, off, key) for key in ("tok_s", "agg")}
        rows.append((kind, c, "ember " + d.split(":")[0], _median(rs), _median(off), spread))
    if args.llama_server:
        rows += [(*row, None) for row in _llama_rows(args, model)]
    print(f"{'kind':8s} {'chats':>5s} {'engine':14s} {'tok/s':>7s} {'agg':>7s} {'speedup (range)':>18s} "
          f"{'agg speedup (range)':>20s} {'accept':>7s} {'k':>5s}")
    for kind, c, name, r, base, spread in rows:
        acc = f"{r['accept']:.0%}" if r.get("accept") is not None else "-"
        per = _spread_text(spread["tok_s"]) if spread else f"{r['tok_s'] / base['tok_s']:.2f}x"
        agg = _spread_text(spread["agg"]) if spread else "-"
        print(f"{kind:8s} {c:5d} {name:14s} {r['tok_s']:7.1f} {r.get('agg', float('nan')):7.1f} {per:>18s} "
              f"{agg:>20s} {acc:>7s} {r.get('k', 0):5.2f}")
    return 0


def _ratios(rs: list[dict], off: list[dict], key: str) -> list[float]:
    """This drafter's figure over off's in the same round (the two ran one after the other)."""
    return [r[key] / o[key] for r, o in zip(rs, off) if o.get(key)]


def _spread_text(ratios: list[float]) -> str:
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def _print_costs(engines: dict) -> None:
    """The measured costs goodput chose k from (engine/speculative/goodput.py), as the engines saw them."""
    for name, engine in engines.items():
        spec = engine.speculator
        if spec is None:
            continue
        a, b, c, e = (x * 1e3 for x in spec.costs.coef)
        line = (f"  {name.split(':')[0]}: target step T = {a:.2f} + {b:.3f}/token + {c:.3f}/1k keys + {e:.2f} "
                f"(several rows) ms over {spec.costs.num_steps} steps; acceptance now {spec.acceptance.rate:.0%}; "
                f"steps held plain by the guard {spec.stats.num_held_back}")
        draft_costs = getattr(spec.drafter, "costs", None)
        if draft_costs is not None:
            line += "; draft forward ms " + ", ".join(f"{n}: {draft_costs(n) * 1e3:.1f}" for n in (1, 2, 4, 8))
        print(line)


def _median(rs: list[dict]) -> dict:
    best = sorted(rs, key=lambda r: r["tok_s"])[len(rs) // 2]
    return best


def _llama_rows(args, model: str) -> list[tuple]:
    from pathlib import Path
    from tempfile import TemporaryDirectory

    from app.bench.lib.processes import llama_server

    rows = []
    with TemporaryDirectory() as tmp:
        # llama.cpp's own defaults for each mode (its server drafts at most 3 tokens by default)
        modes = [((), "llama.cpp off"), (("--spec-type", "ngram-simple"), "llama.cpp ngram")]
        if args.draft:
            modes.append((("-md", args.draft, "--spec-type", "draft-simple"), "llama.cpp draft"))
        for extra, name in modes:
            slots = max(args.concurrency)
            with llama_server(args.llama_server, model, slots, slots * 4096, args.threads, Path(tmp) / "log",
                              extra) as (_, base):
                for kind in args.kinds:
                    for c in args.concurrency:
                        msgs = [messages(kind, i) for i in range(c)]
                        rs = [asyncio.run(_llama_round(base, msgs, args.max_tokens)) for _ in range(args.runs)]
                        rows.append((kind, c, name, _median(rs), None))
    by_cell = {(k, c): r for k, c, n, r, _ in rows if n == "llama.cpp off"}
    return [(k, c, n, r, by_cell[(k, c)]) for k, c, n, r, _ in rows]
