"""Where a batched decode step's time goes: GEMM, attention, other kernels, and Python/dispatch.

Kernel time is the profiler's self time of each aten/oneDNN op (what the op itself ran, on the
calling thread, including its intra-op threads' span); "Python and dispatch" is the profiled
step's wall time minus the sum of all op self times, i.e. the interpreter and the framework
between kernels, plus the profiler's own per-op cost (so an upper bound).
"""
from __future__ import annotations

import time

GEMM_OPS = ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::linear", "aten::matmul",
            "aten::_weight_int8pack_mm", "aten::_weight_int4pack_mm_for_cpu")
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::index_select",
                 "aten::index_copy_", "aten::_scaled_dot_product_attention_math")


def torch_runner(runner):
    """The torch ModelRunner, whose weights and pool the benches read; None for llama.cpp's."""
    from engine.model_runner import ModelRunner

    return runner if isinstance(runner, ModelRunner) else None


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
    """Times in ms per step: `step_ms`, the median wall time of `steps` plain steps; then
    `profiled_ms`, the mean of `steps` profiled ones, split into kernel categories (each op's
    self time) and "python and dispatch" (the rest). The profiler adds its own cost to every op,
    which lands in the last category, so read it as an upper bound."""
    import torch

    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        walls.append((time.perf_counter() - t0) * 1e3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        engine.step()  # the profiler's first start costs a few hundred ms: not a step's cost
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    profiled = (time.perf_counter() - t0) * 1e3 / steps
    cats = {"gemm": 0.0, "attention": 0.0, "other kernels": 0.0}
    for e in prof.key_averages():
        ms = e.self_cpu_time_total / 1e3 / steps
        if e.key in GEMM_OPS:
            cats["gemm"] += ms
        elif e.key in ATTENTION_OPS:
            cats["attention"] += ms
        elif e.key.startswith(("aten::", "mkldnn::")):
            cats["other kernels"] += ms
    cats["python and dispatch"] = max(profiled - sum(cats.values()), 0.0)
    return {"step_ms": sorted(walls)[len(walls) // 2], "profiled_ms": profiled, **cats}


def format_profile(n: int, prof: dict) -> str:
    wall, profiled = prof["step_ms"], prof["profiled_ms"]
    parts = ", ".join(f"{k} {v:.1f} ms ({100 * v / profiled:.0f}%)" for k, v in prof.items()
                      if k not in ("step_ms", "profiled_ms"))
    return (f"profile, torch runner, {n} chats decoding: step {wall:.1f} ms ({n * 1e3 / wall:.0f} tok/s); "
            f"under the profiler {profiled:.1f} ms: {parts}")


STACK_PHASES = ("norms and adds", "qkv", "rope and KV writes", "attention", "o", "gate_up and act", "down",
                "experts (router, grouping, gate_up, act, down)")


def phase_names(moe: bool) -> tuple[str, ...]:
    """The stack's phases a model has: a mixture of experts' FFN is one phase, a dense one two."""
    skip = STACK_PHASES[5:7] if moe else STACK_PHASES[7:]
    return tuple(n for n in STACK_PHASES if n not in skip)


def stack_phases(engine, prompt: list[int], new_tokens: int) -> dict[str, float] | None:
    """ms per decode step of one greedy stream, split by the native decoder stack's own phase
    timers (engine/kernels/csrc/decoder.cpp; the stack is one op, so no outside profiler sees
    inside it): see timed_phases. None when the model runs Python layers or the stream ends at
    its first token (no decode step to time)."""
    from engine.sampling_params import SamplingParams

    runner = torch_runner(engine.runner)
    if runner is None or runner.model.stack is None:
        return None
    engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True))
    while not any(o.new_token_ids for o in engine.step()):  # the prefill, untimed
        pass
    return timed_phases(engine)


def timed_phases(engine, steps: int | None = None) -> dict[str, float] | None:
    """ms per step of the engine's next `steps` steps (all of them till none is left: None), by
    the native stack's phase timers, with `step` the whole engine step, `head` the runner's
    logits (the final matrix and its copy out), and `forward outside the stack` the runner's
    forward less the stack's phases (embedding, RoPE tables, the step's metadata, the op's own
    set-up). None without the native stack, or when no step ran."""
    runner = torch_runner(engine.runner)
    stack = runner.model.stack if runner is not None else None
    if stack is None:
        return None
    stack.set_profile(True)
    timed = {"forward": 0.0, "head": 0.0}

    def add(phase: str, seconds: float) -> None:
        timed[phase] += seconds
    engine.runner.phase_timer = add  # the runner's profiling hook (engine/runner.py)
    done, t0 = 0, time.perf_counter()
    try:
        while engine.has_unfinished() and (steps is None or done < steps):
            engine.step()
            done += 1
    finally:
        engine.runner.phase_timer = None
    wall = time.perf_counter() - t0
    seconds = stack.phases()
    stack.set_profile(False)
    if not done:
        return None
    names = phase_names(bool(runner.model.config.num_experts))
    ms = {name: s * 1e3 / done for name, s in zip(STACK_PHASES, seconds) if name in names}
    outside = timed["forward"] * 1e3 / done - sum(ms.values())
    return {"step": wall * 1e3 / done, **ms, "forward outside the stack": max(outside, 0.0),
            "head": timed["head"] * 1e3 / done}


def format_phases(phases: dict[str, float]) -> str:
    step = phases["step"]
    parts = ", ".join(f"{k} {v:.2f} ({100 * v / step:.0f}%)" for k, v in phases.items() if k != "step")
    rest = step - sum(v for k, v in phases.items() if k != "step")
    return (f"Ember's decode step {step:.2f} ms, by phase (ms): {parts}; "
            f"sampling, scheduler and Python {rest:.2f} ({100 * rest / step:.0f}%)")
