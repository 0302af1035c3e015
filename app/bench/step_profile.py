"""Where a batched decode step's time goes: GEMM, attention, other kernels, and Python/dispatch.

Kernel time is the profiler's self time of each aten/oneDNN op (what the op itself ran, on the
calling thread, including its intra-op threads' span); "Python and dispatch" is an unprofiled
step's wall time minus the sum of all op self times, i.e. the interpreter and the framework
between kernels (the profiler's own per-op cost would otherwise land there).
"""
from __future__ import annotations

import time

GEMM_OPS = ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::linear", "aten::matmul",
            "aten::_weight_int8pack_mm", "aten::_weight_int4pack_mm_for_cpu")
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::index_select",
                 "aten::index_copy_", "aten::_scaled_dot_product_attention_math")


def steady_decode(engine, prompts: list[list[int]], max_tokens: int, warm_steps: int = 4) -> list[str]:
    """Admit every prompt and step until all of them decode (prefills done); returns request ids."""
    from engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    sched = engine.scheduler
    while sched.num_waiting or any(s.is_prefill for s in sched.running):
        engine.step()
    for _ in range(warm_steps):
        engine.step()
    return ids


def profile_steps(engine, steps: int = 10) -> dict:
    """Times in ms per step: the wall time of `steps` plain steps (median), then, from `steps`
    profiled ones, each kernel category's self time. The profiler adds its own cost to every
    op, so "python and dispatch" is the plain wall time minus the kernels, not the profiled one."""
    import torch

    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        walls.append((time.perf_counter() - t0) * 1e3)
    wall = sorted(walls)[len(walls) // 2]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    cats = {"gemm": 0.0, "attention": 0.0, "other kernels": 0.0}
    for e in prof.key_averages():
        ms = e.self_cpu_time_total / 1e3 / steps
        if e.key in GEMM_OPS:
            cats["gemm"] += ms
        elif e.key in ATTENTION_OPS:
            cats["attention"] += ms
        elif e.key.startswith(("aten::", "mkldnn::")):
            cats["other kernels"] += ms
    cats["python and dispatch"] = max(wall - sum(cats.values()), 0.0)
    return {"step_ms": wall, **cats}


def format_profile(n: int, prof: dict) -> str:
    wall = prof["step_ms"]
    parts = ", ".join(f"{k} {v:.1f} ms ({100 * v / wall:.0f}%)" for k, v in prof.items() if k != "step_ms")
    return f"profile, torch runner, {n} chats decoding: step {wall:.1f} ms ({n * 1e3 / wall:.0f} tok/s): {parts}"
