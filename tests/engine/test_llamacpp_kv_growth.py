"""The llama.cpp runner's KV follows the chats (engine/backends/llamacpp_context.py): the context
starts small, is re-created larger when a step needs more cells (every slot's cells carried over),
and smaller once nothing runs; the idle slots keep at most their budget. Outputs must not change:
logits after each resize are compared with llama.cpp deciding the same tokens alone."""
from __future__ import annotations

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from engine.backends.llamacpp_context import MIN_CELLS  # noqa: E402
from test_llamacpp_runner import Oracle, Seq, assert_close, random_prompts, runner_for, step  # noqa: E402


def _grown_runner(path, **kw):
    runner = runner_for(path, num_kv_blocks=256, max_num_batched_tokens=1024, **kw)  # pool: 4096 cells
    assert runner.kv_capacity_blocks() == 256 and runner.n_cells == MIN_CELLS
    return runner


def test_the_context_grows_when_a_step_needs_more_and_the_kv_moves_across(tiny_model_factory):
    path = tiny_model_factory(ctx=1024)
    runner, oracle = _grown_runner(path), Oracle(path)
    a, b = (Seq(i, p) for i, p in enumerate(random_prompts(runner.vocab_size, 2, seed=4, lo=300, hi=300)))
    step(runner, [a])
    assert runner.n_cells == MIN_CELLS  # 300 cells fit the first context
    out = step(runner, [b])  # 600 cells: re-created at 600 + 1/4 -> 768, a's 300 cells carried over
    assert runner.n_cells == 768 and runner._context.num_resizes == 1
    assert_close(out[0], oracle.logits(b.token_ids), "b after the resize")
    a.token_ids.append(7)  # a decodes on KV that moved into the new context
    assert_close(step(runner, [a])[0], oracle.logits(a.token_ids), "a on carried-over KV")
    runner.close()


def test_the_context_shrinks_when_idle_and_the_prompt_cache_survives(tiny_model_factory):
    path = tiny_model_factory(ctx=1024)
    runner, oracle = _grown_runner(path, prompt_cache=True, kv_idle_cache_tokens=400), Oracle(path)
    seqs = [Seq(i, p) for i, p in enumerate(random_prompts(runner.vocab_size, 3, seed=6, lo=250, hi=250))]
    step(runner, seqs)
    assert runner.n_cells == 1024  # 750 cells + 1/4, rounded to llama.cpp's 256
    for s in seqs:
        runner.release(s)
    # 750 idle cells over a budget of 400: the two oldest slots are dropped, the newest kept;
    # nothing runs, so the context is re-created at 512 cells with that slot's 250 cells in it.
    assert runner.num_cached_tokens == 250 and runner.n_cells == MIN_CELLS
    nxt = Seq(9, seqs[2].token_ids + [5, 6, 7])  # the next turn of the chat the cache kept
    assert runner.match_prompt(nxt) == 250
    nxt.num_computed_tokens = runner.claim_prompt(nxt, nxt.num_tokens - 1)
    assert nxt.num_computed_tokens == 250
    assert_close(step(runner, [nxt])[0], oracle.logits(nxt.token_ids), "the next turn after the shrink")
    runner.close()


def test_a_zero_idle_budget_keeps_no_cells(tiny_model_factory):
    path = tiny_model_factory(ctx=1024)
    runner = _grown_runner(path, prompt_cache=True, kv_idle_cache_tokens=0)
    s = Seq(0, random_prompts(runner.vocab_size, 1, seed=8, lo=40, hi=40)[0])
    step(runner, [s])
    runner.release(s)
    assert runner.num_cached_tokens == 0
    runner.close()
