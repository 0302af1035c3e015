"""`ember bench grammar`: what constrained decoding costs, decode tok/s with and without a JSON
schema side by side, one stream and a batch, on each runner.

The same prompt and greedy decoding; the constrained rows decode under a schema whose reply is
long (an array of 40 strings), the plain rows with ignore_eos to the same token count. Decode
rate counts from each stream's first token, so the grammar's compile and the prefill are out of
it; the rows alternate (plain, schema, plain, schema) so drift on a shared machine hits both.
The last columns put the plain step's time next to what the masks of that step cost alone: on a
shared machine that ratio is steadier than the wall-clock rows, which drift with the load.
"""
from __future__ import annotations

import statistics
import time

from app.bench import add_model_args

SCHEMA = {"type": "object", "properties": {"fruits": {
    "type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 40, "maxItems": 40}},
    "required": ["fruits"], "additionalProperties": False}
PROMPT = "List 40 different fruits as JSON."


def decode_rate(engine, streams: int, max_tokens: int, grammar) -> tuple[float, int]:
    """(aggregate decode tok/s after each stream's first token, tokens per stream)."""
    from engine.sampling_params import SamplingParams

    ids = engine.tokenizer.encode(engine.chat_template.render([{"role": "user", "content": PROMPT}]))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, grammar=grammar, ignore_eos=grammar is None)
    rids = [engine.add_request(ids, params) for _ in range(streams)]
    first: dict[str, float] = {}
    count = dict.fromkeys(rids, 0)
    while engine.has_unfinished():
        for o in engine.step():
            first.setdefault(o.request_id, time.perf_counter())
            count[o.request_id] += len(o.new_token_ids)
    end = time.perf_counter()
    start = max(first.values())  # every stream is decoding from here on
    tokens = sum(count.values()) - len(rids)
    return tokens / (end - start) if end > start else 0.0, min(count.values())


def mask_ms(engine, grammar, streams: int, steps: int = 100) -> float:
    """Median ms per step of computing and applying `streams` masks alone (Constraints.apply,
    forced through a valid reply's tokens): the part of a step the grammar adds, measured
    without the forward so that a busy machine blurs it less."""
    import json

    import torch

    from engine.sampling.constrained import Constraints
    from engine.sampling_params import SamplingParams
    from engine.sequence import Sequence

    reply = json.dumps({"fruits": [f"fruit number {i}" for i in range(40)]})
    ids = engine.tokenizer.encode(reply, add_bos=False)[:steps]
    seqs = [Sequence([0], SamplingParams(grammar=grammar)) for _ in range(streams)]
    constraints, times = Constraints(), []
    rows = torch.randn(streams, engine.tokenizer.vocab_size)
    for t in ids:
        r = rows.clone()
        t0 = time.perf_counter()
        constraints.apply(r, seqs)
        times.append(time.perf_counter() - t0)
        constraints.accept(seqs, [t] * streams)
    return statistics.median(times) * 1e3


def run(args) -> int:
    from app.bench.lib.workloads import build_engine
    from engine.grammar import GrammarCompiler
    from engine.model_files.bundled import default_model_path

    path = args.model or str(default_model_path())
    args.concurrency = args.streams
    print(f"model {path}\nthreads {args.threads}; greedy; '{PROMPT}'; decode tok/s after the first token, "
          f"median of {args.repeats}")
    print(f"{'runner':10} {'streams':>7} {'tokens':>7} {'plain':>8} {'schema':>8} {'cost':>7} "
          f"{'step ms':>8} {'mask ms':>8}")
    for backend in args.backend:
        engine = build_engine(path, args, backend)
        t0 = time.perf_counter()
        grammar = GrammarCompiler(engine.tokenizer).json_schema(SCHEMA)
        compile_s = time.perf_counter() - t0
        for streams in args.streams:
            decode_rate(engine, streams, 8, None)  # warm-up
            _, n = decode_rate(engine, 1, args.max_tokens, grammar)
            plain, constrained = [], []
            for _ in range(args.repeats):
                plain.append(decode_rate(engine, streams, n, None)[0])
                constrained.append(decode_rate(engine, streams, args.max_tokens, grammar)[0])
            p, c = statistics.median(plain), statistics.median(constrained)
            step, mask = streams / p * 1e3, mask_ms(engine, grammar, streams)
            print(f"{backend:10} {streams:>7} {n:>7} {p:>8.1f} {c:>8.1f} {(p - c) / p * 100:>6.1f}% "
                  f"{step:>8.1f} {mask:>8.2f}", flush=True)
        print(f"{backend:10} tokenizer + schema compile {compile_s:.2f} s (once per model; then cached)")
        del engine
    return 0


def register(bench_sub) -> None:
    p = bench_sub.add_parser("grammar", help="decode tok/s with and without a JSON schema")
    add_model_args(p)
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--backend", nargs="+", default=["llama.cpp", "torch"], choices=["torch", "llama.cpp"])
    p.set_defaults(func=run)
