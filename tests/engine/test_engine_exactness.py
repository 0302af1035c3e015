"""Continuous batching must not change what a request generates.

Greedy outputs of many concurrent sequences — staggered arrivals, different prompt lengths and
max_tokens, chunked prefill, forced preemption, a shared prefix hitting the prefix cache — are
token-identical, in float32, to each sequence generated alone.
"""
from __future__ import annotations

import random

import pytest

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine_helpers import run_staggered


def _prompts(engine: LLMEngine, n: int, seed: int, prefix: list[int] | None = None) -> list[list[int]]:
    rng = random.Random(seed)
    vocab = engine.tokenizer.vocab_size
    out = []
    for _ in range(n):
        body = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 60))]
        out.append((prefix or []) + body)
    return out


def _alone(engine: LLMEngine, prompt: list[int], max_tokens: int) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return engine.generate([prompt], params)[0].output_token_ids


def _check(engine: LLMEngine, prompts, max_tokens, stagger=2):
    alone = [_alone(engine, p, m) for p, m in zip(prompts, max_tokens)]
    together = run_staggered(engine, prompts, max_tokens, stagger)
    for i, (a, t) in enumerate(zip(alone, together)):
        assert t == a, f"sequence {i} departs at token {next(j for j, (x, y) in enumerate(zip(a, t)) if x != y)}"
    assert engine.block_manager.num_used_blocks == 0 or engine.config.enable_prefix_caching


def _engine(path, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model_path=str(path), dtype="float32", num_threads=2, **kw))


@pytest.mark.parametrize("arch,n_heads,n_kv", [("llama", 4, 1), ("qwen2", 6, 2), ("llama", 4, 4)])
def test_sixteen_concurrent_equal_alone(tiny_model_factory, arch, n_heads, n_kv):
    path = tiny_model_factory(arch=arch, n_heads=n_heads, n_kv_heads=n_kv)
    engine = _engine(path, block_size=4, max_prefill_chunk=16, max_num_batched_tokens=64)
    prompts = _prompts(engine, 16, seed=n_heads)
    max_tokens = [random.Random(i).randint(4, 24) for i in range(16)]
    _check(engine, prompts, max_tokens)


def test_exact_under_preemption(tiny_model_factory):
    path = tiny_model_factory(arch="llama", n_heads=4, n_kv_heads=2)
    engine = _engine(path, block_size=4, num_kv_blocks=40, max_prefill_chunk=8)
    prompts = _prompts(engine, 16, seed=7)
    max_tokens = [random.Random(100 + i).randint(8, 30) for i in range(16)]
    _check(engine, prompts, max_tokens, stagger=1)
    assert engine.scheduler.num_preemptions > 0, "the pool was meant to be too small"


def test_exact_with_shared_prefix_cache_hits(tiny_model_factory):
    path = tiny_model_factory(arch="qwen2", n_heads=4, n_kv_heads=1)
    engine = _engine(path, block_size=4, max_prefill_chunk=12)
    system = _prompts(engine, 1, seed=3)[0][:40]
    prompts = _prompts(engine, 16, seed=11, prefix=system)
    max_tokens = [random.Random(200 + i).randint(4, 16) for i in range(16)]
    _check(engine, prompts, max_tokens)
    assert engine.block_manager.prefix_hit_rate > 0


@pytest.mark.slow
def test_bundled_model_sixteen_concurrent_equal_alone(bundled_model_path):
    engine = _engine(bundled_model_path, max_prefill_chunk=64, max_num_batched_tokens=256)
    system = engine.tokenizer.encode("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    prompts = _prompts(engine, 16, seed=5, prefix=system)
    max_tokens = [random.Random(300 + i).randint(6, 20) for i in range(16)]
    _check(engine, prompts, max_tokens, stagger=3)
