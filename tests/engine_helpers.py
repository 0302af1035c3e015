"""Driving an LLMEngine the way a server does: requests joining while others run."""
from __future__ import annotations

from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams


def run_staggered(engine: LLMEngine, prompts, max_tokens, stagger: int) -> list[list[int]]:
    """Greedy requests join every `stagger` steps; returns each one's output token ids."""
    ids: list[str] = []
    final: dict[str, list[int]] = {}
    pending = list(zip(prompts, max_tokens))
    step = 0
    while pending or engine.has_unfinished():
        if pending and step % stagger == 0:
            p, m = pending.pop(0)
            ids.append(engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True)))
        for o in engine.step():
            if o.finished:
                final[o.request_id] = o.output_token_ids
        step += 1
    return [final[i] for i in ids]
