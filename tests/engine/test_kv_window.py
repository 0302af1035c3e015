"""Sliding-window layers give back the KV blocks behind their window (engine/kv_window.py), on the
real engine and pool with a tiny Gemma 3 (5 of 6 layers slide over 32 tokens; Q8_0, so the
decoder stack runs): the same greedy replies as an engine that keeps every block, the chat's
next turn still hits the prefix cache, and the pool holds fewer pages.

The block manager's own rules (which blocks, which hits) are in tests/engine/test_block_manager.py.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from arch_ggufs import vocab_size, write_arch_gguf
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    path = tmp_path_factory.mktemp("kv-window") / "gemma3.gguf"
    write_arch_gguf(path, "gemma3", seed=5, layers=6, norm_jitter=0.2, qtype=QT.Q8_0)
    return path


def _engine(path, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model_path=str(path), num_threads=1, max_model_len=1024, num_kv_blocks=96,
                                  kv_cache_dtype="float32", **kw))


def _prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab_size(), size=n).tolist()


def test_replies_equal_an_engine_that_keeps_every_block(gemma):
    prompts = [_prompt(300, 1), _prompt(90, 2), _prompt(20, 3)]
    engine = _engine(gemma)
    assert engine.block_manager.window == 32
    ours = [o.output_token_ids for o in engine.generate(prompts, GREEDY)]
    out = sum(b.windowed_out for b in engine.block_manager.blocks)
    # and the chat's next turn: the whole first chat is a prefix-cache hit, window included
    turn = prompts[0] + ours[0] + _prompt(10, 4)
    (second,) = engine.generate([turn], GREEDY)
    assert second.num_cached_tokens >= 320
    engine.close()
    assert out > 0
    keep = _engine(gemma, enable_prefix_caching=False)
    keep.block_manager.window = 0  # every block kept in every layer (`ember bench window` does the same)
    assert [o.output_token_ids for o in keep.generate(prompts, GREEDY)] == ours
    assert keep.generate([turn], GREEDY)[0].output_token_ids == second.output_token_ids
    keep.close()


def test_the_disk_tier_keeps_only_what_the_window_still_reads(gemma, tmp_path):
    """Blocks the window left are written again with the global layer alone (1 of 6); after a
    restart the chat's next turn reads them back, whole where its window reads, and replies as
    an engine that computes the whole prompt."""
    prompt = _prompt(300, 1)
    first = _engine(gemma, kv_disk_dir=str(tmp_path))
    (out,) = first.generate([prompt], GREEDY)
    first.close()  # its writer has written everything
    sizes = sorted(p.stat().st_size for p in tmp_path.glob("*/*.kv"))
    thin, whole = sizes[0], sizes[-1]
    assert len(sizes) == (300 + 40 - 1) // 16 and thin < whole
    assert sum(s == thin for s in sizes) >= len(sizes) - 4  # all but the last window (and its edge)
    turn = prompt + out.output_token_ids + _prompt(10, 4)
    again = _engine(gemma, kv_disk_dir=str(tmp_path))
    (second,) = again.generate([turn], GREEDY)
    again.close()
    assert second.num_cached_tokens == (len(turn) - 1) // 16 * 16  # every full block, from disk
    fresh = _engine(gemma)
    assert fresh.generate([turn], GREEDY)[0].output_token_ids == second.output_token_ids
    fresh.close()


def test_the_pool_holds_the_window_not_the_chat(gemma):
    """A 600-token prompt and 40 tokens of reply: when the reply is nearly done, the global
    layer holds every token and the 5 window layers their last 32 plus up to two blocks of 16,
    about 1/6 + 5/6 * 64/640 = 0.25 of a cache that keeps every block. (While a prompt chunk
    runs, the window layers hold the chunk too: the chunk's tokens are written before its
    queries attend.)"""
    def held(window_freeing: bool) -> int:
        engine = _engine(gemma, enable_prefix_caching=False)
        if not window_freeing:
            engine.block_manager.window = 0
        engine.add_request(_prompt(600, 6), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
        last = 0
        while engine.has_unfinished():
            engine.step()
            if engine.has_unfinished():  # the chat still holds its blocks
                last = engine.runner.kv_pool.resident_bytes()
        engine.close()
        return last

    with_freeing, without = held(True), held(False)
    if without == 0:
        pytest.skip("this system does not report the pool's resident pages (mincore)")
    assert with_freeing < 0.35 * without, (with_freeing, without)


def test_bench_window_reports_both(gemma):
    """`ember bench window` runs end to end (its figures are the test above's measurement)."""
    r = subprocess.run([sys.executable, "-m", "app", "bench", "window", "-m", str(gemma), "--tokens", "300",
                        "--reply", "8", "--threads", "1"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "5 with a 32-token window" in r.stdout and "with window-freeing (measured)" in r.stdout


def test_the_fit_counts_the_window_on_embers_engine_and_all_of_it_on_llama_cpp(gemma):
    """The estimate of one 4,096-token chat: on Ember's engine the 5 window layers count
    32 + 32 edge tokens, the global one every token; llama.cpp's runner keeps them all."""
    from engine.backends import model_footprint
    from engine.model_files.fit import MachineInfo, choose_backend
    from engine.model_files.footprint import RUNTIME_OVERHEAD_BYTES, WINDOW_EDGE_TOKENS, kv_bytes_per_token

    fp = model_footprint(gemma)
    assert (fp.sliding_window, fp.sliding_layers, fp.num_layers) == (32, 5, 6)
    machine = MachineInfo(ram_free_bytes=8 << 30, ram_total_bytes=16 << 30, cpu_count=2, ember_kernels=True)
    per_layer = kv_bytes_per_token(1, fp.num_kv_heads, fp.head_dim, 4)  # float32 KV on this CPU path
    ours = choose_backend(machine, fp, context_length=4096, dtype="float32")
    assert ours.backend == "torch"
    assert ours.est_bytes == fp.weights_bytes + RUNTIME_OVERHEAD_BYTES + per_layer * (
        1 * 4096 + 5 * (32 + WINDOW_EDGE_TOKENS))
    theirs = choose_backend(machine, fp, backend="llama.cpp", context_length=4096)
    assert theirs.est_bytes == fp.weights_bytes + RUNTIME_OVERHEAD_BYTES + 6 * 4096 * per_layer // 2  # f16 KV
