"""The llama.cpp runner's prompt cache: slots keep their cells after a sequence ends, and a new
prompt starts from the longest prefix any slot holds (the next turn of a chat, a shared system
prompt, a preempted sequence resuming). Outputs must not change: each is compared with llama.cpp
deciding the same prompt alone, and with the same engine running without the cache."""
from __future__ import annotations

import random

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from engine.backends.slot_cache import SlotCache, common_prefix_len  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine_helpers import run_staggered  # noqa: E402
from test_llamacpp_engine import assert_same_or_near_tie, llama_greedy, make_engine  # noqa: E402

GREEDY = dict(temperature=0.0, ignore_eos=True)


# ---- bookkeeping (no llama.cpp) -----------------------------------------------------------
def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2
    assert common_prefix_len([], [1]) == 0 and common_prefix_len([5], [6]) == 0


def test_match_prefers_longest_and_decides_take_over_or_share():
    c = SlotCache(4, min_match=3)
    c.park(*[c.acquire()[0]] * 1, tokens=list(range(10)))  # slot 0: 0..9
    c.park(c.acquire()[0], tokens=list(range(4)) + [99] * 20)  # slot 1: shares 4, holds 24
    m = c.match(list(range(12)), live={}, limit=11)
    assert (m.slot, m.num_tokens, m.take_over) == (0, 10, True)  # next turn of slot 0's chat
    m = c.match(list(range(4)) + [7, 7], live={}, limit=5)
    assert (m.slot, m.num_tokens, m.take_over) == (0, 4, False)  # 4 of 10 held: share, keep slot
    assert c.match([0, 1, 50], live={}, limit=2) is None  # under min_match
    m = c.match(list(range(8)), live={3: list(range(8)) + [1]}, limit=7)
    assert m.num_tokens == 7 and m.slot == 0  # ties keep the first (idle) candidate
    m = c.match([9] * 5, live={3: [9] * 6}, limit=4)
    assert (m.slot, m.take_over) == (3, False)  # a running slot can only share


def test_acquire_takes_free_then_lru_idle_but_never_the_source():
    c = SlotCache(2, min_match=1)
    a, _ = c.acquire()
    b, _ = c.acquire()
    c.park(a, [1, 2])
    c.park(b, [3, 4])
    assert c.acquire(keep=a) == (b, True)  # a is the LRU one, but it is the source
    c.park(b, [3, 4])
    assert c.acquire() == (a, True)
    assert c.acquire() == (b, True) and c.acquire() is None
    c.park(a, [])  # nothing computed: straight back to free
    assert c.free == [a] and c.idle_cells == 0


# ---- through the engine (real llama.cpp) ----------------------------------------------------
def _chat(engine, prompt, n):
    out = engine.generate([prompt], SamplingParams(max_tokens=n, **GREEDY))[0]
    return out


def test_next_turn_reuses_the_conversation(tiny_model_factory):
    path = tiny_model_factory(n_heads=4, n_kv_heads=2)
    engine = make_engine(path, block_size=4)
    rng = random.Random(3)
    turn1 = [rng.randrange(3, 200) for _ in range(40)]
    r1 = _chat(engine, turn1, 12)
    assert engine.stats().cached_tokens == len(turn1) + 11  # the last sampled token has no KV yet
    turn2 = turn1 + r1.output_token_ids + [rng.randrange(3, 200) for _ in range(9)]
    r2 = _chat(engine, turn2, 12)
    assert r2.num_cached_tokens == len(turn1) + 11
    assert engine.block_manager.prefix_hit_rate > 0
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=1024, n_threads=1, verbose=False,
                          flash_attn=engine.runner.flash_attn)
    want, probs = llama_greedy(llm, turn2, 12)
    assert_same_or_near_tie(r2.output_token_ids, want, probs, "second turn")
    cold = make_engine(path, block_size=4, enable_prefix_caching=False)
    assert _chat(cold, turn2, 12).output_token_ids == r2.output_token_ids
    assert _chat(cold, turn2, 1).num_cached_tokens == 0 and cold.stats().cached_tokens == 0


def test_shared_system_prompt_is_shared_not_recomputed(tiny_model_factory):
    path = tiny_model_factory(arch="qwen2", n_heads=4, n_kv_heads=1)
    engine = make_engine(path, block_size=4, max_prefill_chunk=16)
    rng = random.Random(4)
    system = [rng.randrange(3, 200) for _ in range(30)]
    prompts = [system + [rng.randrange(3, 200) for _ in range(rng.randint(2, 12))] for _ in range(6)]
    max_tokens = [rng.randint(6, 14) for _ in range(6)]
    got = run_staggered(engine, prompts, max_tokens, stagger=3)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=1024, n_threads=1, verbose=False,
                          flash_attn=engine.runner.flash_attn)
    for i, (p, m, g) in enumerate(zip(prompts, max_tokens, got)):
        want, probs = llama_greedy(llm, p, m)
        assert_same_or_near_tie(g, want, probs, f"prompt {i}")
    hits = engine.block_manager.num_hit_tokens
    assert hits >= 5 * len(system) - 5, f"only {hits} prompt tokens came from the cache"
    assert engine.block_manager.num_used_blocks == 0 and not engine.runner._slot_of


def test_full_buffer_evicts_idle_slots_and_keeps_answers_right(tiny_model_factory):
    """A pool of 24 blocks of 4 cells: idle slots must give way to new sequences; a preempted
    sequence resumes from its own idle slot when it is still there."""
    path = tiny_model_factory(n_heads=4, n_kv_heads=2)
    engine = make_engine(path, block_size=4, num_kv_blocks=24, max_prefill_chunk=8)
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 200) for _ in range(rng.randint(20, 40))] for _ in range(10)]
    max_tokens = [rng.randint(8, 20) for _ in range(10)]
    got = run_staggered(engine, prompts, max_tokens, stagger=2)
    cold = make_engine(path, block_size=4, num_kv_blocks=24, max_prefill_chunk=8, enable_prefix_caching=False)
    assert run_staggered(cold, prompts, max_tokens, stagger=2) == got
    assert engine.scheduler.num_preemptions > 0
    assert engine.block_manager.num_hit_tokens > 0, "no preempted sequence resumed from its slot"
    runner = engine.runner
    assert runner.num_cached_tokens <= runner.n_cells
    assert len(runner._slots.free) + len(runner._slots.idle) == runner.n_seq_max
