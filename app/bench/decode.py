"""`ember bench decode`: single-stream prefill and decode speed, Ember next to llama.cpp.

Both run the same GGUF file on the same threads in the same process, one after the other,
each `--runs` times; the table shows medians. Prefill tok/s = prompt tokens / time to the
first token; decode tok/s = (new tokens − 1) / time from the first to the last token.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from app.bench import add_model_args
from app.bench.lib.llamacpp_build import describe
from app.bench.lib.roofline import (gguf_bytes_per_token, kv_bytes_read, model_bytes_per_token, read_rate,
                                   roofline_rows, stream)
from app.bench.lib.workloads import bench_ember, make_prompt
from app.bench.step_profile import format_phases, stack_phases, torch_runner
from app.bench.synthetic import add_synthetic_args, bench_model_path


def bench_llamacpp(llm, prompt: list[int], new_tokens: int) -> tuple[float, float]:
    llm.reset()
    t0 = time.perf_counter()
    t_first = None
    n = 0
    for _ in llm.generate(prompt, temp=0.0, reset=True):
        n += 1
        if t_first is None:
            t_first = time.perf_counter()
        if n >= new_tokens:
            break
    t_end = time.perf_counter()
    return len(prompt) / (t_first - t0), (n - 1) / (t_end - t_first)


def kv_pool_bytes(runner) -> int:
    """The torch runner's KV pool where it is resident at load (zero-filled); a lazy pool
    (engine/kv_pool.py) holds no pages before chats write it, and llama.cpp's is its own."""
    runner = torch_runner(runner)
    if runner is None or runner.kv_pool.lazy:
        return 0
    return sum(t.numel() * t.element_size() for kv in runner.kv_caches for t in kv)


def weight_bytes(runner) -> int:
    """Bytes of the torch model's tensors (0 for llama.cpp, whose weights are its own)."""
    runner = torch_runner(runner)
    if runner is None:
        return 0
    return sum(t.numel() * t.element_size() for t in (*runner.model.parameters(), *runner.model.buffers()))


def decode_kv_bytes(runner, prompt_tokens: int, new_tokens: int) -> dict[str, int]:
    """K and V bytes a decoded token reads, per engine, at the decode's mean context: tokens 2..n
    of a timed decode attend to prompt + 1 .. prompt + n - 1 keys, prompt + n/2 on average.
    Ember's rows are its pool's; llama.cpp's cache is f16 (2 bytes a value)."""
    runner = torch_runner(runner)
    if runner is None:
        return {"ember": 0, "llama.cpp": 0}
    config, context = runner.model.config, prompt_tokens + new_tokens // 2
    k_cache = runner.kv_caches[0][0]
    row = k_cache.shape[-1] * k_cache.element_size()  # one KV head's row (q8_0: codes and scales)
    return {"ember": kv_bytes_read(config, context, row),
            "llama.cpp": kv_bytes_read(config, context, 2 * config.head_dim)}


def bytes_read(runner, path: str):
    """(weight bytes a decoded token reads, per engine; the buffer the read rate is measured on,
    between the engines' runs): as many bytes, or for a mixture of experts its whole file, which
    the experts a token takes are read out of (a buffer of their size alone would sit in cache)."""
    ember = torch_runner(runner)
    weights_read = {"ember": model_bytes_per_token(ember.model) if ember is not None else 0,
                    "llama.cpp": gguf_bytes_per_token(path)}
    moe = ember is not None and ember.model.config.num_experts
    return weights_read, stream(max(*weights_read.values(), Path(path).stat().st_size if moe else 0))


def kernel_note(runner) -> str:
    from engine.kernels import default_path

    runner = torch_runner(runner)
    if runner is None:
        return "llama.cpp's"
    return f"Ember's, {default_path().name} path" if runner.quantized else "dense weights (torch's)"


def run(args) -> int:
    import llama_cpp
    import psutil
    import torch

    from engine.backends import load_engine
    from engine.config import EngineConfig

    path = bench_model_path(args)
    torch.set_num_threads(args.threads)
    rss0 = psutil.Process().memory_info().rss
    engine, decision = load_engine(EngineConfig(model_path=path, dtype=args.dtype, weights=args.weights,
                                                kv_cache_dtype=args.kv_cache_dtype,
                                                num_threads=args.threads, mmproj=args.mmproj,
                                                max_prefill_chunk=max(args.prompt_tokens, 16),
                                                max_num_batched_tokens=max(args.prompt_tokens, 1024),
                                                enable_prefix_caching=False), args.backend, args.device)
    args.dtype = f"{decision.backend}/{decision.dtype}"
    model_rss = psutil.Process().memory_info().rss - rss0 - kv_pool_bytes(engine.runner)
    llm = llama_cpp.Llama(model_path=path, n_ctx=args.prompt_tokens + args.new_tokens + 16,
                          n_batch=max(args.prompt_tokens, 512), n_threads=args.threads, verbose=False)
    prompt = make_prompt(engine.tokenizer.encode, args.prompt_tokens)
    bench_ember(engine, prompt[:32], 8)  # warm-up: allocator, kernels, caches
    bench_llamacpp(llm, prompt[:32], 8)
    rows = {"ember": [], "llama.cpp": []}
    weights_read, plain = bytes_read(engine.runner, path)
    rates = []
    kv = decode_kv_bytes(engine.runner, args.prompt_tokens, args.new_tokens)
    per_token = {k: v + kv[k] if v else 0 for k, v in weights_read.items()}
    for _ in range(args.runs):
        rows["ember"].append(bench_ember(engine, prompt, args.new_tokens))
        rates.append(read_rate(plain))
        rows["llama.cpp"].append(bench_llamacpp(llm, prompt, args.new_tokens))
    med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in rows.items()}
    print(f"model {path}\nthreads {args.threads}, dtype {args.dtype}, prompt {args.prompt_tokens} tokens, "
          f"{args.new_tokens} new tokens, median of {args.runs} runs")
    print(describe(llama_cpp))
    print(f"{'engine':<12}{'prefill tok/s':>15}{'decode tok/s':>15}")
    for k, (pp, tg) in med.items():
        print(f"{k:<12}{pp:>15.1f}{tg:>15.1f}")
    size = Path(path).stat().st_size
    weights = weight_bytes(engine.runner)
    print(f"RSS of Ember's loaded engine (KV pool excluded): {model_rss / 2**20:.0f} MiB, "
          f"{model_rss / size:.2f}x the {size / 2**20:.0f} MiB file, of which weights "
          f"{weights / 2**20:.0f} MiB ({weights / size:.2f}x); kernels: {kernel_note(engine.runner)}")
    e, l = med["ember"], med["llama.cpp"]
    print(f"{'ember/llama':<12}{e[0] / l[0]:>15.2f}{e[1] / l[1]:>15.2f}")
    rate = statistics.median(rates)
    print(f"read rate {rate / 1e9:.1f} GB/s (sum() over {plain.numel() * 4 / 2**20:.0f} MiB, "
          f"{args.threads} threads, median of {args.runs}, between the runs): the decode roofline, over the "
          f"weights and K and V at the decode's mean context ({args.prompt_tokens + args.new_tokens // 2} tokens)")
    print("\n".join(roofline_rows({k: v[1] for k, v in med.items()}, per_token, rate, kv)))
    phases = stack_phases(engine, prompt, args.new_tokens)
    if phases is not None:  # where the step's time goes, for a fraction short of the roofline
        print(format_phases(phases))
    return 0


def register(bench_sub) -> None:
    p = bench_sub.add_parser("decode", help="single-stream prefill and decode tok/s, Ember vs llama.cpp")
    add_model_args(p, backend="torch")  # Ember's own engine by default: the one this bench is for
    add_synthetic_args(p)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=3)
    p.set_defaults(func=run)
