"""`ember bench turns`: time to first token through a multi-turn chat, prompt cache on and off.

Each turn re-sends the whole conversation (as a chat client does) plus a new question; the
engine's prefix cache (block hashes on torch, slots on llama.cpp) should make a turn's TTFT
depend on the new message, not on the history. Both settings run the same conversation, with
greedy replies, in one process; llama-cpp-python (`Llama.create_chat_completion`, which keeps
only the last prompt's KV) runs it too, as the peer.
"""
from __future__ import annotations

import statistics
import time

from app.bench import add_model_args

QUESTIONS = [
    "Tell me about the history of the printing press.", "Who used it first in Europe?",
    "How did it change science?", "And what about religion?", "Summarize all of that in a list.",
    "Which of those effects was the largest?", "What came after the printing press?",
    "Write a short poem about it.",
]


def run_engine(engine, turns: int, reply_tokens: int) -> list[float]:
    from engine.sampling_params import SamplingParams

    messages: list[dict] = []
    ttfts = []
    for q in QUESTIONS[:turns]:
        messages.append({"role": "user", "content": q})
        ids = engine.tokenizer.encode(engine.chat_template.render(messages, add_generation_prompt=True))
        t0 = time.perf_counter()
        rid = engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=reply_tokens, ignore_eos=True))
        first, text = None, ""
        while engine.has_unfinished():
            for o in engine.step():
                if o.request_id == rid:
                    first = first or time.perf_counter()
                    text += o.new_text
        ttfts.append(first - t0)
        messages.append({"role": "assistant", "content": text})
    return ttfts


def run_llamacpp(llm, turns: int, reply_tokens: int) -> list[float]:
    messages: list[dict] = []
    ttfts = []
    for q in QUESTIONS[:turns]:
        messages.append({"role": "user", "content": q})
        t0 = time.perf_counter()
        first, text = None, ""
        for chunk in llm.create_chat_completion(messages, max_tokens=reply_tokens, temperature=0.0, stream=True):
            delta = chunk["choices"][0]["delta"].get("content")
            if delta:
                first = first or time.perf_counter()
                text += delta
        ttfts.append((first or time.perf_counter()) - t0)
        messages.append({"role": "assistant", "content": text})
    return ttfts


def run(args) -> int:
    import llama_cpp

    from app.bench.lib.workloads import build_engine
    from engine.model_files.bundled import default_model_path

    path = args.model or str(default_model_path())
    args.concurrency = [1]
    rows = {}
    for backend in args.backend:
        for cache in (True, False):
            engine = build_engine(path, args, backend, prefix_caching=cache)
            rows[f"ember/{backend} cache {'on' if cache else 'off'}"] = run_engine(engine, args.turns, args.reply_tokens)
            del engine
    llm = llama_cpp.Llama(model_path=path, n_ctx=4096, n_threads=args.threads, verbose=False)
    rows["llama-cpp-python"] = run_llamacpp(llm, args.turns, args.reply_tokens)
    print(f"model {path}\nthreads {args.threads}; {args.turns} turns, {args.reply_tokens}-token greedy replies; "
          "time to first token of each turn in ms (the whole conversation is re-sent every turn)")
    print(f"{'':32}" + "".join(f"{i + 1:>7}" for i in range(args.turns)) + f"{'median':>9}")
    for name, ts in rows.items():
        print(f"{name:32}" + "".join(f"{t * 1e3:>7.0f}" for t in ts) + f"{statistics.median(ts) * 1e3:>9.0f}")
    return 0


def register(bench_sub) -> None:
    p = bench_sub.add_parser("turns", help="TTFT through a multi-turn chat, prompt cache on vs off")
    add_model_args(p)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--reply-tokens", type=int, default=64)
    p.add_argument("--backend", nargs="+", default=["llama.cpp", "torch"], choices=["torch", "llama.cpp"])
    p.set_defaults(func=run)
