"""`ember bench window`: the KV one long chat holds on Ember's engine with the sliding-window
layers giving back the blocks behind their window (engine/kv_window.py), and without.

One chat of --tokens tokens (a prompt, then --reply tokens of greedy reply) per run; the figure
is the KV pool's resident bytes (mincore over its pages) just before the reply ends, next to
what the layers' shapes say a cache that keeps every token holds.
"""
from __future__ import annotations

from app.bench import add_model_args


def held_bytes(args, window_freeing: bool) -> tuple[int, object]:
    """Resident pool bytes at the chat's last step, and the engine's model config."""
    import torch

    from app.bench.lib.workloads import make_prompt
    from engine.backends import load_engine
    from engine.config import EngineConfig
    from engine.model_files.bundled import default_model_path
    from engine.sampling_params import SamplingParams

    torch.set_num_threads(args.threads)
    engine, _ = load_engine(EngineConfig(model_path=args.model or str(default_model_path()), dtype=args.dtype,
                                         weights=args.weights, kv_cache_dtype=args.kv_cache_dtype,
                                         num_threads=args.threads, max_model_len=args.tokens + 16,
                                         enable_prefix_caching=False), "torch", args.device)
    try:
        if not window_freeing:
            engine.block_manager.window = 0
        prompt = make_prompt(engine.tokenizer.encode, args.tokens - args.reply)
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=args.reply, ignore_eos=True))
        held = 0
        while engine.has_unfinished():
            engine.step()
            if engine.has_unfinished():
                held = engine.runner.kv_pool.resident_bytes()
        return held, engine.runner.model.config, engine.runner.kv_dtype.itemsize
    finally:
        engine.close()


def run(args) -> int:
    held, config, itemsize = held_bytes(args, True)
    kept, _, _ = held_bytes(args, False)
    c = config
    full = 2 * c.num_layers * c.num_kv_heads * c.head_dim * itemsize * args.tokens
    windows = [w for w in c.layer_windows if w]
    print(f"model {args.model or 'bundled'}: {c.num_layers} layers, {len(windows)} with a "
          f"{max(windows, default=0)}-token window; one chat of {args.tokens} tokens, KV {itemsize * 8}-bit")
    print(f"{'KV held':<34}{'MiB':>10}")
    print(f"{'every token, every layer (shapes)':<34}{full / 2**20:>10.1f}")
    print(f"{'without window-freeing (measured)':<34}{kept / 2**20:>10.1f}")
    print(f"{'with window-freeing (measured)':<34}{held / 2**20:>10.1f}")
    if kept:
        print(f"with/without: {held / kept:.2f}")
    return 0


def register(bench_sub) -> None:
    p = bench_sub.add_parser("window", help="KV held by one long chat with sliding-window layers freeing "
                                            "blocks, and without")
    add_model_args(p, backend="torch", no_images="the window's freed blocks are Ember's torch engine's, "
                                                 "which has no image path (a projector runs on llama.cpp)")
    p.add_argument("--tokens", type=int, default=8192, help="the chat's length (prompt + reply)")
    p.add_argument("--reply", type=int, default=32, help="tokens of reply at its end")
    p.set_defaults(func=run)
