"""The torch runner's KV pool (engine/kv_pool.py): reserved, committed as written, given back.

Exactness first: a given-back block reads as zeros, and a page shared with a block still in use
is never given back. The resident-page checks read the kernel's own count for the pool's mapping
(/proc/self/smaps), which is exact for a private anonymous mapping with huge pages declined.
"""
from __future__ import annotations

import sys

import pytest
import torch

from engine.config import EngineConfig
from engine.kv_pool import PAGE, KVPool
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")


def resident_kib(address: int) -> int:
    """Rss of the mapping that starts at `address`, from /proc/self/smaps."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            inside = int(head.split("-")[0], 16) == address
        elif inside and head == "Rss:":
            return int(line.split()[1])
    raise LookupError(f"no mapping at {address:#x}")


def _pool(num_blocks=40, block_size=16, n_kv=3, hd=64, dtype=torch.bfloat16, layers=2) -> KVPool:
    return KVPool(layers, num_blocks, block_size, n_kv, hd, dtype, torch.device("cpu"))


def test_a_fresh_pool_reads_zeros_and_has_the_layout_the_kernels_read():
    pool = _pool()
    assert pool.lazy and len(pool.caches) == 2
    for k, v in pool.caches:
        assert k.shape == v.shape == (40, 16, 3, 64) and k.is_contiguous() and v.is_contiguous()
        assert k.data_ptr() % PAGE == 0 and not k.any() and not v.any()


def test_given_back_blocks_read_zeros_and_shared_pages_keep_live_neighbours():
    pool = _pool()  # 6 KiB blocks: a page can hold parts of two blocks
    for k, v in pool.caches:
        k.fill_(1.0)
        v.fill_(2.0)
    live = {3, 7}
    freed = [4, 5, 6]
    pool.give_back(freed, lambda b: b not in live)
    for k, v in pool.caches:
        assert (k[3] == 1).all() and (k[7] == 1).all() and (v[3] == 2).all() and (v[7] == 2).all()
        assert (k[:3] == 1).all() and (k[8:] == 1).all()  # blocks not reported are untouched
        # blocks 4..6 span bytes [24 KiB, 42 KiB): pages 6..9 lie wholly inside; page 10
        # ([40 KiB, 44 KiB)) holds the end of block 6 and the start of the live block 7: it stays.
        flat = k.view(-1).view(torch.uint8)
        assert not flat[6 * PAGE:10 * PAGE].any()
        assert (flat[10 * PAGE:42 * 1024] != 0).all()  # part of block 6 on a page block 7 shares


@linux
def test_only_written_pages_are_resident_and_given_back_pages_leave():
    pool = _pool(num_blocks=2048, layers=1)  # 12 MiB per tensor, reserved
    base = pool.caches[0][0].data_ptr()
    assert resident_kib(base) == 0
    for k, v in pool.caches:
        k[:64] = 1.0  # 64 blocks: 384 KiB written in each of K and V
        v[:64] = 1.0
    assert resident_kib(base) == 2 * 64 * 6
    pool.give_back(range(64), lambda b: True)
    assert resident_kib(base) == 0
    assert not pool.caches[0][0][:64].any()


def test_a_gpu_pool_is_allocated_up_front(monkeypatch):
    """Off the CPU the pool is torch.zeros as before; give_back does nothing there."""
    pool = KVPool(1, 4, 16, 1, 8, torch.float32, torch.device("meta"))
    assert not pool.lazy and pool.caches[0][0].device.type == "meta"
    pool.give_back([0, 1], lambda b: True)


def test_the_engine_gives_back_finished_chats_and_answers_the_same(bundled_model_path):
    """Real engine on the bundled model: chats that finish return their clean blocks to the OS,
    the touched blocks stay a compact prefix of the pool, and the same prompt run on given-back
    blocks generates the same tokens as on a fresh pool."""
    config = EngineConfig(model_path=str(bundled_model_path), dtype="float32", num_threads=2,
                          num_kv_blocks=256, max_model_len=512, kv_idle_cache_tokens=0)
    engine = LLMEngine(config)
    pool, bm = engine.runner.kv_pool, engine.block_manager
    assert bm.on_clean is not None and bm.max_cached_free == 0
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [f"Tell me about the number {i}." for i in range(4)]
    first = [o.output_token_ids for o in engine.generate(prompts, params)]
    assert bm.num_used_blocks == 0 and bm.num_cached_blocks == 0 and sorted(bm.clean_free) == list(range(256))
    for k, v in pool.caches:  # every block was given back: the whole pool reads zeros again
        assert not k.any() and not v.any()
    again = [o.output_token_ids for o in engine.generate(prompts, params)]
    assert again == first
    engine.close()
