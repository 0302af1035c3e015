"""Sequences on the KV block pool: prefix cache, allocation that follows the schedule, fork with
copy-on-write. No torch; the pool itself (ref counts, free lists) is engine/block_pool.py.

A sequence's block table maps its logical block i (token positions [i*B, (i+1)*B)) to a
physical block of the pool. Allocation follows the schedule (vLLM V1's allocate_slots): before
a step computes n tokens of a sequence, its table is made to cover num_computed_tokens + n.

Prefix cache: a block whose B tokens are all computed gets a chained hash
h_i = H(h_{i-1}, tokens of block i), so h_i names the whole prefix up to that block. A new
sequence reuses the longest run of cached leading blocks (ref_count + 1) instead of computing
them; never all of its tokens, so at least one is computed and yields the next token's logits.

With a sliding window (window > 0), the leading blocks a sequence's window layers will never
read again are reported to `on_window_out` (the runner gives back those layers' pages; see
engine/kv_window.py) and no prefix hit relies on their window-layer K/V.

With a disk tier (engine/kv_disk/), every block that gets a hash is offered to it, and a prefix
the RAM cache misses is looked up there: `match_prefix(seq, from_disk=True)` reads the blocks
it holds back into free blocks, which join the cache as if they had been computed.
"""
from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable
from typing import Protocol

from engine.block_pool import NO_HASH, BlockPool
from engine.kv_window import blocks_out_of_window, usable_hits
from engine.sequence import Sequence


def hash_block_tokens(parent_hash: int, token_ids: list[int] | tuple[int, ...]) -> int:
    """Chained 128-bit BLAKE2b of (parent hash, token ids): collisions are out of reach even
    for prompts crafted to collide (Python's tuple hash is not), and blocks still compare
    their token ids on a hit."""
    h = hashlib.blake2b(digest_size=16)
    if parent_hash != NO_HASH:
        h.update(parent_hash.to_bytes(16, "little"))
    h.update(array("q", token_ids).tobytes())
    return int.from_bytes(h.digest(), "little")


class DiskCache(Protocol):
    """What the block manager asks of a disk tier (engine/kv_disk/tier.py's DiskTier)."""

    def offer(self, blocks: list[tuple[int, int]]) -> None: ...  # (block id, hash) just hashed
    def contains(self, block_hash: int) -> bool: ...
    def fetch(self, block_hash: int, block_id: int) -> bool | None: ...  # False: windowed out; None: not read
    def thin(self, blocks: list[tuple[int, int]]) -> None: ...  # (block id, hash) the window left


class BlockManager(BlockPool):
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 max_cached_free: int | None = None,
                 on_clean: Callable[[list[int], Callable[[int], bool]], None] | None = None,
                 window: int = 0,
                 on_window_out: Callable[[list[int], Callable[[int], bool]], None] | None = None,
                 disk: DiskCache | None = None) -> None:
        super().__init__(num_blocks, block_size, max_cached_free, on_clean)
        self.disk = disk if enable_prefix_caching else None
        self.enable_prefix_caching = enable_prefix_caching
        self.window, self.on_window_out = window, on_window_out
        self.num_query_tokens = 0  # prompt tokens looked up in the prefix cache
        self.num_hit_tokens = 0  # of those, found

    @property
    def prefix_hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_query_tokens if self.num_query_tokens else 0.0

    # ---- prefix cache --------------------------------------------------------------------
    def _block_hashes(self, seq: Sequence, num_blocks: int) -> list[int]:
        """The chained hashes of seq's first num_blocks full blocks (memoised on the seq)."""
        B, hashes = self.block_size, seq.block_hashes
        for i in range(len(hashes), num_blocks):
            parent = hashes[i - 1] if i else NO_HASH
            hashes.append(hash_block_tokens(parent, seq.token_ids[i * B:(i + 1) * B]))
        return hashes

    def match_prefix(self, seq: Sequence, from_disk: bool = False) -> list[int]:
        """Cached blocks for seq's leading full blocks; never all of its tokens. No side effects,
        but with from_disk the blocks after the RAM hits that the disk tier holds are read back
        first. A sequence that scores its prompt (prompt_logprobs) needs logits at every
        position, so it computes them all (it still offers its blocks to others)."""
        if not self.enable_prefix_caching or seq.scores_prompt:
            return []
        B = self.block_size
        max_blocks = (seq.num_tokens - 1) // B  # the last token is always computed
        hits: list[int] = []
        for i, h in enumerate(self._block_hashes(seq, max_blocks)[:max_blocks]):
            block_id = self.hash_to_block_id.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tuple(seq.token_ids[i * B:(i + 1) * B]):
                break
            hits.append(block_id)
        if from_disk and self.disk is not None and len(hits) < max_blocks:
            hits += self._read_from_disk(seq, hits, max_blocks)
        if self.window:
            del hits[usable_hits([self.blocks[b].windowed_out for b in hits], self.window, B):]
        return hits

    def _read_from_disk(self, seq: Sequence, hits: list[int], max_blocks: int) -> list[int]:
        """Bring seq's blocks after `hits` back from the disk tier into free blocks, which join
        the cache (free, hashed); the hits are held meanwhile so that no block taken evicts them."""
        B, hashes, loaded, cleaned = self.block_size, seq.block_hashes, [], []
        for b in hits:
            self._touch(b)
        room = self.num_free_blocks if self.max_cached_free is None else min(self.num_free_blocks,
                                                                                self.max_cached_free - len(hits))
        for i in range(len(hits), min(max_blocks, len(hits) + max(room, 0))):
            h = hashes[i]
            if h in self.hash_to_block_id or not self.disk.contains(h):
                break
            block_id = self._take_free_block()
            whole = self.disk.fetch(h, block_id)
            if whole is None:
                self._release(block_id, cleaned)
                break
            block = self.blocks[block_id]
            block.windowed_out = not whole
            block.hash, block.token_ids = h, tuple(seq.token_ids[i * B:(i + 1) * B])
            self.hash_to_block_id[h] = block_id
            loaded.append(block_id)
        for b in reversed(hits + loaded):  # the prefix's first block is the last to be evicted
            self._release(b, cleaned)
        self._report_clean(cleaned)
        return loaded

    def hash_blocks(self, seq: Sequence) -> None:
        """Register seq's blocks whose tokens are now all computed. A block whose prefix is
        already cached elsewhere (two equal prompts computed side by side) stays unhashed."""
        if not self.enable_prefix_caching:
            return
        B = self.block_size
        num_full = min(seq.num_computed_tokens, seq.num_tokens) // B
        if num_full <= seq.num_hashed_blocks:
            return
        hashes, new = self._block_hashes(seq, num_full), []
        for i in range(seq.num_hashed_blocks, num_full):
            h, block = hashes[i], self.blocks[seq.block_table[i]]
            if block.hash == NO_HASH and h not in self.hash_to_block_id:
                block.hash, block.token_ids = h, tuple(seq.token_ids[i * B:(i + 1) * B])
                self.hash_to_block_id[h] = block.block_id
                new.append((block.block_id, h))
        seq.num_hashed_blocks = num_full
        if new and self.disk is not None:
            self.disk.offer(new)

    # ---- allocation ----------------------------------------------------------------------
    def num_needed_blocks(self, seq: Sequence, num_new_tokens: int, cached: list[int] = ()) -> int:
        """Free blocks it takes to cover seq's cache hits plus n new tokens after them: new
        blocks, revived cached blocks and copies of shared blocks about to be written."""
        B, table, blocks = self.block_size, seq.block_table, self.blocks
        start = seq.num_computed_tokens + len(cached) * B
        end_blocks = (start + num_new_tokens + B - 1) // B
        needed = max(0, end_blocks - len(table) - len(cached))
        for b in cached:
            needed += blocks[b].ref_count == 0  # revived from the free list
        for i in range(start // B, min(len(table), end_blocks)):
            needed += blocks[table[i]].ref_count > 1  # copy-on-write
        return needed

    def can_allocate(self, seq: Sequence, num_new_tokens: int | None = None,
                     cached: list[int] | None = None) -> bool:
        """Whether a sequence without blocks can take its cache hits plus n new tokens
        (default: the rest of its tokens)."""
        cached = self.match_prefix(seq) if cached is None else cached
        n = seq.num_tokens - len(cached) * self.block_size if num_new_tokens is None else num_new_tokens
        return self.num_needed_blocks(seq, n, cached) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int | None = None,
                 cached: list[int] | None = None) -> None:
        """Admit a sequence: take its prefix-cache hits (counted as computed) and slots for n
        new tokens after them (default: all the rest). Call can_allocate first."""
        assert not seq.block_table and seq.num_computed_tokens == 0, "sequence already holds blocks"
        cached = self.match_prefix(seq) if cached is None else cached
        num_cached = len(cached) * self.block_size
        n = seq.num_tokens - num_cached if num_new_tokens is None else num_new_tokens
        if self.num_needed_blocks(seq, n, cached) > self.num_free_blocks:
            raise RuntimeError("not enough free KV blocks; check can_allocate first")
        for block_id in cached:
            self._touch(block_id)
        seq.block_table = list(cached)
        seq.num_computed_tokens = num_cached
        if not seq.num_preemptions:  # usage reports the prompt's hits, not a recompute's
            seq.num_cached_tokens = num_cached
        seq.num_hashed_blocks = len(cached)
        self.num_query_tokens += seq.num_tokens
        self.num_hit_tokens += num_cached
        self.append_slots(seq, n)

    def count_external_hit(self, seq: Sequence, num_tokens: int) -> None:
        """After `allocate(seq, k + n)`: the runner already held the first k tokens (its own
        prompt cache), so they count as computed and as prefix-cache hits."""
        seq.num_computed_tokens = num_tokens
        if not seq.num_preemptions:
            seq.num_cached_tokens = num_tokens
        self.num_hit_tokens += num_tokens

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        start, table = seq.num_computed_tokens, seq.block_table
        first = start // self.block_size
        if (start % self.block_size and (start + num_new_tokens - 1) // self.block_size == first
                and first < len(table) and self.blocks[table[first]].ref_count == 1):
            return True  # fast path: the tokens go into the sequence's own last block
        return self.num_needed_blocks(seq, num_new_tokens) <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_new_tokens: int = 1) -> list[tuple[int, int]]:
        """Make seq's table cover num_computed_tokens + n tokens. A shared block about to be
        written is copied first; returns the (src, dst) block copies the runner must make."""
        B, table = self.block_size, seq.block_table
        start = seq.num_computed_tokens
        if self.window:
            self._window_out(seq)
        end_blocks = (start + num_new_tokens + B - 1) // B
        first = start // B
        if start % B and end_blocks == first + 1 <= len(table) and self.blocks[table[first]].ref_count == 1:
            return []  # fast path: the tokens go into the sequence's own last block
        if self.num_needed_blocks(seq, num_new_tokens) > self.num_free_blocks:
            raise RuntimeError("not enough free KV blocks; check can_append first")
        copies = []
        for i in range(start // B, min(len(table), end_blocks)):
            src = table[i]
            if self.blocks[src].ref_count > 1:  # shared with a fork: copy before writing
                dst = self._take_free_block()
                self._release(src, [])  # still referenced: it cannot turn clean
                table[i] = dst
                copies.append((src, dst))
        while len(table) < end_blocks:
            table.append(self._take_free_block())
        return copies

    def _window_out(self, seq: Sequence) -> None:
        """Report the leading blocks seq's window layers are done with. Only blocks seq alone
        holds: a block shared with a fork or a prefix hit may sit in the other's window, so
        it (and the blocks after it) wait for a later step."""
        out: list[int] = []
        for i in range(blocks_out_of_window(seq.num_computed_tokens, self.window, self.block_size)):
            block = self.blocks[seq.block_table[i]]
            if block.windowed_out:
                continue
            if block.ref_count != 1:
                break
            block.windowed_out = True
            out.append(block.block_id)
        if out and self.disk is not None:  # before the window layers' pages go: only the others are read
            self.disk.thin([(b, self.blocks[b].hash) for b in out if self.blocks[b].hash != NO_HASH])
        if out and self.on_window_out is not None:
            self.on_window_out(out, lambda b: self.blocks[b].windowed_out or self.is_clean(b))

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Share all of parent's blocks with child; the first write into a shared block copies it."""
        assert not child.block_table, "the child already holds blocks"
        for block_id in parent.block_table:
            self.blocks[block_id].ref_count += 1
        child.block_table = list(parent.block_table)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_hashed_blocks = parent.num_hashed_blocks

    def free(self, seq: Sequence) -> None:
        """Drop seq's references, last block first so a prefix outlives its tails on the LRU list."""
        cleaned: list[int] = []
        for block_id in reversed(seq.block_table):
            self._release(block_id, cleaned)
        self._report_clean(cleaned)
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_hashed_blocks = 0

    def trim(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Free blocks past the first num_tokens positions (default num_computed_tokens) after a
        rollback (rejected speculative tokens); call it once token_ids and num_computed_tokens
        are rolled back."""
        del seq.block_hashes[seq.num_tokens // self.block_size:]
        keep = self.num_blocks_for(seq.num_computed_tokens if num_tokens is None else num_tokens)
        cleaned: list[int] = []
        while len(seq.block_table) > keep:
            self._release(seq.block_table.pop(), cleaned)
        self._report_clean(cleaned)
        seq.num_hashed_blocks = min(seq.num_hashed_blocks, seq.num_computed_tokens // self.block_size)
