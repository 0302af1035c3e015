"""LLMEngine (the engine's own scheduler, sampler, detokenizer) driving llama.cpp's kernels.

Greedy generation of 8 concurrent prompts through `LLMEngine(config, runner=LlamaCppRunner)` must
equal llama.cpp's own greedy output for each prompt decoded alone (llama_cpp.Llama, high-level
API): token-identical, or departing first at a near-tie (top-2 probabilities within 0.10 at that
step, since llama.cpp batches are not bitwise batch-invariant).
"""
from __future__ import annotations

import random

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from engine.backends import config_for, create_runner, decide  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine_helpers import run_staggered  # noqa: E402
from test_llamacpp_runner import last_logits  # noqa: E402

NEAR_TIE = 0.10


def llama_greedy(llm, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """llama.cpp alone: greedy tokens and the probabilities at each step."""
    llm.reset()
    llm.eval(prompt)
    out, probs = [], []
    for _ in range(n):
        logits = last_logits(llm).astype(np.float64)
        p = np.exp(logits - logits.max())
        probs.append(p / p.sum())
        out.append(int(np.argmax(logits)))
        llm.eval([out[-1]])
    return out, probs


def assert_same_or_near_tie(got: list[int], want: list[int], probs: list[np.ndarray], what: str):
    for j, (g, w) in enumerate(zip(got, want)):
        if g != w:
            gap = probs[j][w] - probs[j][g]
            assert gap <= NEAR_TIE, f"{what}: departs at token {j} ({g} vs {w}), prob gap {gap:.3f}"
            return
    assert len(got) == len(want), what


def make_engine(path, **kw) -> LLMEngine:
    config = EngineConfig(model_path=str(path), num_threads=1, **kw)
    decision = decide(config, backend="llama.cpp", device="cpu")
    assert (decision.backend, decision.device) == ("llama.cpp", "cpu")
    config = config_for(config, decision)
    return LLMEngine(config, runner=create_runner(config, decision))


def check_engine_equals_llama(path, prompts, max_tokens, stagger=1, **kw):
    engine = make_engine(path, **kw)
    got = run_staggered(engine, prompts, max_tokens, stagger)
    # The same attention kernel as the runner create_runner builds (flash attention).
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=1024, n_threads=1, n_threads_batch=1, verbose=False,
                          flash_attn=engine.runner.flash_attn)
    for i, (p, m, g) in enumerate(zip(prompts, max_tokens, got)):
        want, probs = llama_greedy(llm, p, m)
        assert_same_or_near_tie(g, want, probs, f"prompt {i}")
    assert engine.block_manager.num_used_blocks == 0
    assert not engine.runner._slot_of, "every finished sequence released its llama.cpp slot"
    return engine


def test_tiny_eight_concurrent_equal_llama(tiny_model_factory):
    path = tiny_model_factory(n_heads=4, n_kv_heads=2)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 200) for _ in range(rng.randint(3, 40))] for _ in range(8)]
    max_tokens = [rng.randint(4, 20) for _ in range(8)]
    check_engine_equals_llama(path, prompts, max_tokens, block_size=4, max_prefill_chunk=16,
                              max_num_batched_tokens=64)


def test_tiny_under_preemption(tiny_model_factory):
    """A pool too small for all 8: the scheduler preempts (recompute), the runner releases the
    victim's cells, and outputs still equal llama.cpp alone."""
    path = tiny_model_factory(arch="qwen2", n_heads=4, n_kv_heads=1)
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 200) for _ in range(rng.randint(10, 30))] for _ in range(8)]
    max_tokens = [rng.randint(10, 24) for _ in range(8)]
    engine = check_engine_equals_llama(path, prompts, max_tokens, block_size=4, num_kv_blocks=30,
                                       max_prefill_chunk=8)
    assert engine.scheduler.num_preemptions > 0, "the pool was meant to be too small"


@pytest.mark.slow
def test_bundled_eight_concurrent_chats_equal_llama(bundled_model_path):
    engine = make_engine(bundled_model_path)
    tok = engine.tokenizer
    questions = ["What is the capital of France?", "Write a haiku about rain.",
                 "Explain recursion to a child.", "List three prime numbers.",
                 "def fib(n):", "Translate 'good morning' to German.",
                 "Why is the sky blue?", "Give me a name for a cat."]
    prompts = [tok.encode(engine.chat_template.render([{"role": "user", "content": q}])) for q in questions]
    del engine
    check_engine_equals_llama(bundled_model_path, prompts, [24] * 8, stagger=2,
                              max_prefill_chunk=64, max_num_batched_tokens=256)
