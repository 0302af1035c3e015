"""What the engine hands back: each step's output of a request, and the engine's counters. No torch."""
from __future__ import annotations

from dataclasses import dataclass

from engine.runner import TokenLogprobs
from engine.speculative.speculator import SpecStats


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    new_text: str
    output_token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None
    num_prompt_tokens: int
    num_cached_tokens: int
    logprobs: list[TokenLogprobs] | None = None  # for the new tokens, when asked
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # [None, lp(t1|t0), ...] once scored
    arrival_time: float = 0.0
    first_token_time: float | None = None
    num_spec_proposed: int = 0  # draft tokens verified for this request
    num_spec_accepted: int = 0  # of those, accepted
    embedding: list[float] | None = None  # an embedding request's mean-pooled vector (not normalized)


@dataclass(slots=True)
class EngineStats:
    kv_blocks_total: int
    kv_blocks_used: int
    cached_tokens: int
    prefix_hit_rate: float
    num_running: int
    num_waiting: int
    block_size: int
    max_model_len: int
    spec: SpecStats | None = None  # speculative decoding's counters, when it is on
    weight_bytes: int | None = None  # the runner's weights and KV reservation (engine/runner.py)
    kv_bytes: int | None = None
    num_threads: int | None = None
