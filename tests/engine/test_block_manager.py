"""BlockManager: exact counts, prefix cache, copy-on-write, windows, by example and by property
(the random mix of operations against a stand-in KV pool is test_block_manager_stateful.py)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine.block_manager as bm_module
from engine.block_manager import BlockManager
from engine.sequence import Sequence

from block_manager_util import prefix_keys  # tests/


def _seq(tokens, seq_id=None) -> Sequence:
    return Sequence(list(tokens), seq_id=seq_id)


def _compute(bm: BlockManager, seq: Sequence, n: int) -> None:
    """What a step does to the bookkeeping: slots for n tokens, they get computed, hashed."""
    bm.append_slots(seq, n)
    seq.num_computed_tokens += n
    bm.hash_blocks(seq)


# ---- examples ---------------------------------------------------------------------------------

def test_allocate_covers_prompt_and_counts_add_up():
    bm = BlockManager(10, 4)
    seq = _seq(range(10))
    assert bm.can_allocate(seq)
    bm.allocate(seq)
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
    assert (bm.num_free_blocks, bm.num_used_blocks) == (7, 3)
    assert seq.num_cached_tokens == 0 and bm.num_cached_tokens == 0
    seq.num_computed_tokens = 10
    bm.hash_blocks(seq)
    assert bm.num_cached_tokens == 8  # two full blocks; the third holds 2 of 4 tokens
    bm.free(seq)
    assert (bm.num_free_blocks, bm.num_used_blocks) == (10, 0)
    assert bm.num_cached_tokens == 8  # freed blocks keep their hashes
    bm.check()


def test_prefix_hit_reuses_blocks_and_never_the_whole_prompt():
    bm = BlockManager(16, 4)
    a = _seq(range(12))
    bm.allocate(a)
    a.num_computed_tokens = 12
    bm.hash_blocks(a)
    b = _seq(list(range(12)))  # the same 12 tokens: 3 full blocks, but one token must be computed
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    assert b.num_cached_tokens == b.num_computed_tokens == 8
    assert bm.blocks[a.block_table[0]].ref_count == 2
    c = _seq([*range(8), 99, 98, 97, 96, 95])  # diverges in block 2
    bm.allocate(c)
    assert c.block_table[:2] == a.block_table[:2] and c.num_cached_tokens == 8
    assert bm.prefix_hit_rate == pytest.approx(16 / (12 + 12 + 13))
    bm.check()


def test_prompt_scoring_sequences_compute_every_position_but_share_their_blocks():
    from engine.sampling_params import SamplingParams

    bm = BlockManager(16, 4)
    a = _seq(range(9))
    bm.allocate(a)
    a.num_computed_tokens = 9
    bm.hash_blocks(a)
    scoring = Sequence(list(range(9)), SamplingParams(prompt_logprobs=0))
    bm.allocate(scoring)
    assert scoring.num_computed_tokens == 0 and len(scoring.block_table) == 3
    later = _seq(range(9))
    bm.allocate(later)
    assert later.num_cached_tokens == 8


def test_freed_blocks_keep_hash_and_revive():
    bm = BlockManager(8, 4)
    a = _seq(range(9))
    bm.allocate(a)
    a.num_computed_tokens = 9
    bm.hash_blocks(a)
    table = list(a.block_table)
    bm.free(a)
    assert bm.num_free_blocks == 8 and bm.num_cached_blocks == 2
    b = _seq(range(9))
    assert bm.can_allocate(b)
    bm.allocate(b)
    assert b.block_table[:2] == table[:2] and b.num_cached_tokens == 8
    assert bm.num_used_blocks == 3  # two revived, one new
    bm.check()


def test_lru_evicts_least_recently_freed_and_prefix_last():
    bm = BlockManager(6, 2)
    a = _seq(range(6))  # 3 full blocks
    bm.allocate(a)
    a.num_computed_tokens = 6
    bm.hash_blocks(a)
    first, second, third = a.block_table
    bm.free(a)  # freed tail first: the prefix block is evicted last
    assert list(bm.cached_free)[-3:] == [third, second, first]
    other = _seq([50, 51, 52, 53, 54, 55, 56, 57, 58, 59])  # needs 5 blocks: 3 never-hashed + 2 evicted
    bm.allocate(other)
    assert first not in other.block_table and second in other.block_table and third in other.block_table
    assert bm.num_cached_blocks == 1
    again = _seq(range(6))
    assert bm.match_prefix(again) == [first]


def test_colliding_hashes_are_caught_by_the_token_check(monkeypatch):
    monkeypatch.setattr(bm_module, "hash_block_tokens", lambda parent, tokens: 7)  # every block collides
    bm = BlockManager(8, 4)
    a = _seq([1, 2, 3, 4, 5])
    bm.allocate(a)
    a.num_computed_tokens = 5
    bm.hash_blocks(a)
    assert bm.num_cached_blocks == 1
    b = _seq([9, 9, 9, 9, 5])
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and b.block_table[0] != a.block_table[0]


def test_fork_shares_then_copies_on_write():
    bm = BlockManager(8, 4)
    parent = _seq(range(6))
    bm.allocate(parent)
    parent.num_computed_tokens = 6
    bm.hash_blocks(parent)
    parent.append_token(100)
    child = parent.fork()
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    assert [bm.blocks[b].ref_count for b in parent.block_table] == [2, 2]
    assert bm.can_append(child, 1)
    copies = bm.append_slots(child, 1)  # position 6 lies in the shared, half-full block 1
    assert copies == [(parent.block_table[1], child.block_table[1])]
    assert child.block_table[0] == parent.block_table[0]  # the full block stays shared
    assert bm.append_slots(parent, 1) == []  # now the parent owns its block alone
    assert sum(b.ref_count for b in bm.blocks) == len(parent.block_table) + len(child.block_table)
    bm.check()


def test_out_of_blocks_is_refused_not_half_done():
    bm = BlockManager(3, 4)
    a = _seq(range(12))
    assert bm.can_allocate(a)
    bm.allocate(a)
    b = _seq(range(20, 25))
    assert not bm.can_allocate(b)
    with pytest.raises(RuntimeError):
        bm.allocate(b)
    assert b.block_table == [] and bm.num_free_blocks == 0
    a.num_computed_tokens = 12
    assert not bm.can_append(a, 1)
    with pytest.raises(RuntimeError):
        bm.append_slots(a, 1)
    assert len(a.block_table) == 3
    bm.check()


def test_chunked_allocation_follows_the_schedule():
    bm = BlockManager(10, 4)
    seq = _seq(range(18))
    bm.allocate(seq, 5)  # first chunk of 5 tokens: 2 blocks
    assert len(seq.block_table) == 2
    seq.num_computed_tokens = 5
    bm.hash_blocks(seq)
    assert bm.num_cached_blocks == 1
    _compute(bm, seq, 8)  # 13 tokens: 4 blocks, 3 full
    assert len(seq.block_table) == 4 and bm.num_cached_blocks == 3
    _compute(bm, seq, 5)
    assert len(seq.block_table) == 5 and bm.num_cached_blocks == 4


def test_trim_releases_blocks_past_a_rollback():
    bm = BlockManager(10, 4)
    seq = _seq(range(7))
    bm.allocate(seq)
    seq.num_computed_tokens = 7
    seq.token_ids += [1, 2, 3, 4]  # four speculative tokens, scheduled and computed
    _compute(bm, seq, 4)
    assert len(seq.block_table) == 3
    del seq.token_ids[8:]  # three rejected
    seq.num_computed_tokens = 8
    bm.trim(seq)
    assert len(seq.block_table) == 2 and bm.num_used_blocks == 2
    bm.check()


def test_window_layers_give_back_blocks_behind_the_window_and_hits_keep_theirs():
    """Window 4, blocks of 2: a query at position p reads keys p-3..p in the window layers, so
    once a step starts at 20, blocks 0..7 (positions 0..15) are out (the window of the last
    block boundary is kept); a prefix hit that ends where those blocks would be needed is cut
    back, one that ends at the sequence's last full block (the chat's next turn) is whole."""
    out: list[int] = []
    bm = BlockManager(40, 2, window=4, on_window_out=lambda ids, is_out: out.extend(ids))
    a = _seq(range(20))
    bm.allocate(a)
    a.num_computed_tokens = 20
    bm.hash_blocks(a)
    assert out == []  # the prompt's own queries needed every block
    a.token_ids.append(99)
    _compute(bm, a, 1)  # the step at 20
    assert out == a.block_table[:8] and all(bm.blocks[b].windowed_out for b in out)
    _compute(bm, a, 0)  # the step at 21: the same boundary (20), nothing more, none twice
    assert out == a.block_table[:8]
    b = _seq([*range(10), 7, 7, 7])  # shares 5 blocks, whose window (positions 6..9) is gone
    assert bm.match_prefix(b) == []
    d = _seq([*range(18), 5, 5, 5])  # 9 blocks: its first query at 18 reads 15..17, and block 7 is out
    assert bm.match_prefix(d) == []
    c = _seq([*range(20), 99, 5, 5])  # the chat's next turn: the hit's window (blocks 8, 9) is intact
    assert bm.match_prefix(c) == a.block_table[:10]
    bm.free(a)
    bm.allocate(c)  # freed with their hashes: still a hit, and still out of the window
    assert c.num_computed_tokens == 20 and bm.blocks[c.block_table[0]].windowed_out
    bm.check()


def test_a_block_shared_with_a_fork_stays_until_both_are_past_it():
    out: list[int] = []
    bm = BlockManager(40, 2, window=2, on_window_out=lambda ids, is_out: out.extend(ids))
    a = _seq(range(8))
    bm.allocate(a)
    a.num_computed_tokens = 8
    child = a.fork()
    bm.fork(a, child)
    a.token_ids.append(1)
    _compute(bm, a, 1)
    assert out == []  # blocks 0..2 are out of a's window, but the child may still read them
    bm.free(child)
    _compute(bm, a, 0)  # the step at 9 keeps the window of 8: blocks 0..2 (positions 0..5) are out
    assert out == a.block_table[:3]


def test_clean_blocks_go_out_lowest_first_and_are_reported_once():
    """Freed blocks without a hash are reused before untouched ones, so the blocks ever written
    stay a compact prefix of the pool; each block that turns clean is reported to on_clean."""
    reported: list[int] = []
    bm = BlockManager(32, 4, max_cached_free=0, on_clean=lambda ids, _: reported.extend(ids))
    a, b = _seq(range(10)), _seq(range(100, 110))
    bm.allocate(a)
    bm.allocate(b)
    assert (a.block_table, b.block_table) == ([0, 1, 2], [3, 4, 5])
    a.num_computed_tokens = 10
    bm.hash_blocks(a)  # two full blocks hashed; with no cache budget they are cleaned when freed
    bm.free(a)
    assert sorted(reported) == [0, 1, 2] and bm.num_cached_blocks == 0
    c = _seq(range(200, 206))
    bm.allocate(c)
    assert c.block_table == [0, 1]  # not 6, 7: the touched set does not grow
    bm.check()


def test_the_idle_cache_keeps_the_most_recently_freed_blocks():
    reported: list[int] = []
    bm = BlockManager(32, 4, max_cached_free=2, on_clean=lambda ids, _: reported.extend(ids))
    a = _seq(range(13))  # blocks 0..3, three full
    bm.allocate(a)
    a.num_computed_tokens = 13
    bm.hash_blocks(a)
    bm.free(a)  # freed last block first: 3 (no hash) cleaned, then 2, 1, 0 cached; 2 evicted
    assert reported == [3, 2] and list(bm.cached_free) == [1, 0]
    again = _seq(range(13))
    assert bm.match_prefix(again) == [0, 1]  # the prefix survives
    bm.check()


# ---- hit property ----------------------------------------------------------------------------

@settings(max_examples=80, deadline=None)
@given(prefix=st.lists(st.integers(0, 50), min_size=1, max_size=40),
       tail=st.lists(st.integers(51, 99), max_size=10), block_size=st.sampled_from([1, 3, 4, 16]))
def test_a_shared_prefix_hits_exactly_its_full_blocks(prefix, tail, block_size):
    bm = BlockManager(64, block_size)
    first = _seq(prefix)
    bm.allocate(first)
    first.num_computed_tokens = first.num_tokens
    bm.hash_blocks(first)
    second = _seq(prefix + tail)
    bm.allocate(second)
    expected = min(len(prefix) // block_size, (second.num_tokens - 1) // block_size)
    assert second.num_cached_tokens == expected * block_size
    assert second.block_table[:expected] == first.block_table[:expected]
    assert len(set(second.block_table[expected:]) & set(first.block_table)) == 0
    bm.check()


@settings(max_examples=80, deadline=None)
@given(prompt=st.lists(st.integers(0, 9), min_size=1, max_size=20), block_size=st.sampled_from([1, 2, 4, 8]),
       order=st.lists(st.booleans(), min_size=1, max_size=24), data=st.data())
def test_forks_diverge_without_touching_each_others_kv(prompt, block_size, order, data):
    """Parent and child decode different tokens in any interleaving; each reads back only its own."""
    bm = BlockManager(64, block_size)
    pool = {}

    def run(seq, n):
        for src, dst in bm.append_slots(seq, n):
            for off in range(block_size):
                if (src, off) in pool:
                    pool[(dst, off)] = pool[(src, off)]
        keys = prefix_keys(seq.token_ids)
        for p in range(seq.num_computed_tokens, seq.num_computed_tokens + n):
            pool[(seq.block_table[p // block_size], p % block_size)] = keys[p]
        seq.num_computed_tokens += n
        bm.hash_blocks(seq)

    parent = _seq(prompt)
    bm.allocate(parent, 0)
    run(parent, len(prompt))
    child = parent.fork()
    bm.fork(parent, child)
    for to_parent in order:
        seq = parent if to_parent else child
        seq.append_token(data.draw(st.integers(10, 19)) if to_parent else data.draw(st.integers(20, 29)))
        run(seq, 1)
    for seq in (parent, child):
        keys = prefix_keys(seq.token_ids)
        assert [pool[(seq.block_table[p // block_size], p % block_size)] for p in range(seq.num_tokens)] == keys
    bm.check()
    bm.free(parent)
    bm.free(child)
    assert bm.num_free_blocks == 64
