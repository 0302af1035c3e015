"""In-process workloads on Ember's engine: the prompt, one timed stream, the engine to run them on."""
from __future__ import annotations

import time


def make_prompt(tokenizer_encode, n_tokens: int) -> list[int]:
    """A natural-ish prompt of exactly n_tokens (repeated corpus-like text, cut to length)."""
    text = ("The quick brown fox jumps over the lazy dog while the engine counts tokens. "
            "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n") * 64
    ids = tokenizer_encode(text)
    while len(ids) < n_tokens:
        ids = ids + ids
    return ids[:n_tokens]


def bench_ember(engine, prompt: list[int], new_tokens: int) -> tuple[float, float]:
    """One greedy stream of `new_tokens` (ignore_eos): (prefill tok/s to the first token, decode
    tok/s from the first to the last)."""
    from engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    engine.add_request(prompt, params)
    t_first = None
    n = 0
    while engine.has_unfinished():
        for o in engine.step():
            n += len(o.new_token_ids)
            if t_first is None and o.new_token_ids:
                t_first = time.perf_counter()
    t_end = time.perf_counter()
    return len(prompt) / (t_first - t0), (n - 1) / (t_end - t_first)


def build_engine(path: str, args, backend: str, prefix_caching: bool = False):
    """Ember with the torch runner, or with the llama.cpp runner under the same scheduler
    (prefix caching off by default: every chat here is new, as for llama-cpp-python)."""
    from engine.backends import load_engine
    from engine.config import EngineConfig

    cfg = EngineConfig(model_path=path, dtype=args.dtype, weights=args.weights, kv_cache_dtype=args.kv_cache_dtype,
                       num_threads=args.threads,
                       max_num_seqs=max([*args.concurrency, *(getattr(args, "profile", None) or [])]),
                       max_model_len=1024,
                       enable_prefix_caching=prefix_caching, mmproj=args.mmproj)
    return load_engine(cfg, backend, args.device)[0]


QUESTIONS = [
    "Explain how a hash map works.", "Write a haiku about autumn.", "What is a prime number?",
    "Give three tips for learning Python.", "Why is the sky blue?", "Summarize the plot of Hamlet.",
    "How do vaccines work?", "What is the capital of Australia and why?",
]


def chat_prompts(engine, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        q = QUESTIONS[i % len(QUESTIONS)] + (f" (variant {i})" if i >= len(QUESTIONS) else "")
        text = engine.chat_template.render([{"role": "user", "content": q}], add_generation_prompt=True)
        out.append(engine.tokenizer.encode(text))
    return out
