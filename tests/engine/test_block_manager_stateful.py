"""BlockManager under a random mix of operations: no leaks, no double frees, exact counts.

The stateful test keeps a stand-in KV pool: slot (block, offset) holds the token at that
position and a chained hash of the prefix it was computed from (its K/V depend on exactly that). After any random
mix of allocate / append / fork / free / preempt, every computed position of every live
sequence must read back its own prefix through its block table — so a wrong cache hit, a
missing copy-on-write or a block handed to two owners shows up as a wrong read.
"""
from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.block_manager import BlockManager
from engine.block_pool import NO_HASH
from engine.sequence import Sequence

from block_manager_util import prefix_keys  # tests/


# ---- stateful property test -----------------------------------------------------------------

TOKENS = st.lists(st.integers(0, 3), min_size=1, max_size=30)  # a tiny alphabet: many shared prefixes


class BlockManagerMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(1, 24), block_size=st.sampled_from([1, 2, 4]),
                caching=st.booleans(), max_cached_free=st.sampled_from([None, 0, 1, 3]),
                window=st.sampled_from([0, 0, 1, 3, 8]))
    def setup(self, num_blocks, block_size, caching, max_cached_free, window):
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching,
                               max_cached_free=max_cached_free, on_clean=self._give_back,
                               window=window, on_window_out=self._window_out)
        self.B, self.W = block_size, window
        self.pool = {}  # (block, offset) -> prefix tuple whose K/V sit there
        self.wpool = {}  # the same for the sliding-window layers, which give back blocks out of their window
        self.live: list[Sequence] = []  # hold blocks
        self.waiting: list[Sequence] = []  # preempted: no blocks, tokens kept
        self.next_id = 0

    def _give_back(self, block_ids: list[int], is_clean) -> None:
        """What the torch runner does with a clean block: its pages go back and read as zeros.
        A block still in use (or still cached) given back would fail the read-back invariants."""
        for b in block_ids:
            assert is_clean(b) and self.bm.blocks[b].ref_count == 0 and self.bm.blocks[b].hash == NO_HASH
            for off in range(self.B):
                self.pool.pop((b, off), None)
                self.wpool.pop((b, off), None)

    def _window_out(self, block_ids: list[int], is_out) -> None:
        """The window layers' pages of blocks out of every holder's window go back (read as
        zeros); a block some sequence's window still reads would fail the read in _write."""
        assert self.W
        for b in block_ids:
            assert is_out(b) and self.bm.blocks[b].ref_count == 1
            for off in range(self.B):
                self.wpool.pop((b, off), None)

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _write(self, seq: Sequence, n: int) -> None:
        """Run n tokens: the runner makes the copies, then writes each new position's K/V. With
        a window, the first new query's window (whose keys every later one's includes or writes
        now) must read its own prefix from the window layers' pool."""
        keys = prefix_keys(seq.token_ids)
        start = seq.num_computed_tokens
        for p in range(max(0, start - self.W + 1) if self.W else start, start):
            assert self.wpool.get((seq.block_table[p // self.B], p % self.B)) == (seq.token_ids[p], keys[p])
        for p in range(seq.num_computed_tokens, seq.num_computed_tokens + n):
            self.pool[(seq.block_table[p // self.B], p % self.B)] = (seq.token_ids[p], keys[p])
            self.wpool[(seq.block_table[p // self.B], p % self.B)] = (seq.token_ids[p], keys[p])
        seq.num_computed_tokens += n
        self.bm.hash_blocks(seq)

    def _copy(self, copies) -> None:
        for src, dst in copies:
            for off in range(self.B):
                if (src, off) in self.pool:
                    self.pool[(dst, off)] = self.pool[(src, off)]
                if (src, off) in self.wpool:
                    self.wpool[(dst, off)] = self.wpool[(src, off)]

    def _admit(self, seq: Sequence, chunk: int) -> bool:
        cached = self.bm.match_prefix(seq)
        n = min(chunk, seq.num_tokens - len(cached) * self.B)
        if not self.bm.can_allocate(seq, n, cached):
            return False
        free_before = self.bm.num_free_blocks
        lowest = min(self.bm.clean_free, default=None)
        self.bm.allocate(seq, n, cached)
        if lowest is not None and len(seq.block_table) > len(cached):
            assert lowest in seq.block_table  # clean blocks are handed out lowest first
        assert self.bm.num_free_blocks <= free_before
        assert seq.num_computed_tokens == seq.num_cached_tokens == len(cached) * self.B < seq.num_tokens
        self._write(seq, n)
        self.live.append(seq)
        return True

    @rule(tokens=TOKENS, chunk=st.integers(1, 32))
    def add(self, tokens, chunk):
        self._admit(Sequence(tokens, seq_id=self._new_id()), chunk)

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 100), chunk=st.integers(1, 32))
    def resume(self, i, chunk):
        seq = self.waiting[i % len(self.waiting)]
        if self._admit(seq, chunk):
            self.waiting.remove(seq)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), n=st.integers(1, 16), new_token=st.integers(0, 3))
    def step(self, i, n, new_token):
        """Continue a prefill by n tokens, or sample one token and decode it."""
        seq = self.live[i % len(self.live)]
        if seq.num_computed_tokens == seq.num_tokens:
            seq.append_token(new_token)
        n = min(n, seq.num_tokens - seq.num_computed_tokens)
        if not self.bm.can_append(seq, n):
            return
        self._copy(self.bm.append_slots(seq, n))
        assert len(seq.block_table) == self.bm.num_blocks_for(seq.num_computed_tokens + n)
        self._write(seq, n)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def fork(self, i):
        parent = self.live[i % len(self.live)]
        child = parent.fork(seq_id=self._new_id())
        self.bm.fork(parent, child)
        self.live.append(child)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def free(self, i):
        seq = self.live.pop(i % len(self.live))
        self.bm.free(seq)
        assert seq.block_table == [] and seq.num_computed_tokens == 0

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def preempt(self, i):
        seq = self.live.pop(i % len(self.live))
        self.bm.free(seq)
        self.waiting.append(seq)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def free_twice_is_harmless(self, i):
        """free() empties the table, so a second free has nothing left to release."""
        seq = self.live.pop(i % len(self.live))
        self.bm.free(seq)
        self.bm.free(seq)

    @invariant()
    def counts_add_up(self):
        bm = self.bm
        bm.check()
        assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
        refs = Counter(b for seq in self.live for b in seq.block_table)
        assert sum(b.ref_count for b in bm.blocks) == sum(len(s.block_table) for s in self.live)
        for block in bm.blocks:
            assert block.ref_count == refs[block.block_id], block  # no leak, no double free
        assert bm.num_cached_tokens == self.B * sum(b.hash != NO_HASH for b in bm.blocks)
        if not bm.enable_prefix_caching:
            assert bm.num_cached_tokens == 0
        assert 0.0 <= bm.prefix_hit_rate <= 1.0

    @invariant()
    def every_computed_position_reads_its_own_prefix(self):
        for seq in self.live:
            assert len(seq.block_table) >= self.bm.num_blocks_for(seq.num_computed_tokens)
            keys = prefix_keys(seq.token_ids)
            for p in range(seq.num_computed_tokens):
                assert self.pool.get((seq.block_table[p // self.B], p % self.B)) == (seq.token_ids[p], keys[p])

    @invariant()
    def hashed_blocks_hold_computed_full_prefixes(self):
        for block in self.bm.blocks:
            if block.hash != NO_HASH:
                assert len(block.token_ids) == self.B
                written = tuple(self.pool.get((block.block_id, off), (None,))[0] for off in range(self.B))
                assert written == block.token_ids


BlockManagerMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestBlockManagerMachine = BlockManagerMachine.TestCase
