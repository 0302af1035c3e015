"""The pool of fixed-size KV blocks: ref counts, a clean free list and an LRU of freed blocks
that keep their prefix-cache hash. No torch; engine/block_manager.py maps sequences onto it.

Freed blocks keep their hash (lazy eviction) and wait on an LRU list of cached free blocks:
freed blocks are appended at the tail, a cache hit on one takes it off the list, and at most
`max_cached_free` of them are kept (the oldest give up their hash beyond that).

Memory follows use: a free block without a hash is "clean", and clean blocks are handed out
lowest id first (before any cached block is evicted), so the blocks ever written stay a compact
prefix of the pool. Each block that turns clean is reported to `on_clean` (the torch runner gives
its pages back to the OS); a pool reserved but not touched then holds only live and cached KV.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable

NO_HASH = -1

class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids", "windowed_out")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.windowed_out = False  # its window layers' K/V were given back (kv_window.py)
        self.hash = NO_HASH  # set once the block is full, computed and registered in the cache
        self.token_ids: tuple[int, ...] = ()  # the block's tokens while it holds a hash

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_count}, hashed={self.hash != NO_HASH})"


class BlockPool:
    """num_blocks blocks of block_size token slots; which sequence holds which is BlockManager's."""

    def __init__(self, num_blocks: int, block_size: int, max_cached_free: int | None = None,
                 on_clean: Callable[[list[int], Callable[[int], bool]], None] | None = None) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        if max_cached_free is not None and max_cached_free < 0:
            raise ValueError("max_cached_free must be >= 0")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_cached_free = max_cached_free  # None: keep every freed block's hash
        self.on_clean = on_clean
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.clean_free: list[int] = list(range(num_blocks))  # a min-heap: lowest id first
        # LRU of free blocks holding a hash; an OrderedDict is a deque that can also drop a revived block in O(1).
        self.cached_free: OrderedDict[int, None] = OrderedDict()
        self.used_block_ids: set[int] = set()

    # ---- accounting ----------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.clean_free) + len(self.cached_free)

    @property
    def num_used_blocks(self) -> int:
        return len(self.used_block_ids)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that hold a valid hash, in use or free (revivable)."""
        return len(self.hash_to_block_id)

    @property
    def num_cached_tokens(self) -> int:
        return len(self.hash_to_block_id) * self.block_size

    @property
    def usage(self) -> float:
        return len(self.used_block_ids) / self.num_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- block pool ----------------------------------------------------------------------
    def _take_free_block(self) -> int:
        """The lowest clean block, else the least recently freed cached one (its hash goes now)."""
        if self.clean_free:
            block_id = heapq.heappop(self.clean_free)
        else:
            block_id, _ = self.cached_free.popitem(last=False)
            self._drop_hash(self.blocks[block_id])
        block = self.blocks[block_id]
        assert block.ref_count == 0
        block.ref_count, block.windowed_out = 1, False
        self.used_block_ids.add(block_id)
        return block_id

    def _drop_hash(self, block: Block) -> None:
        del self.hash_to_block_id[block.hash]
        block.hash, block.token_ids = NO_HASH, ()

    def _touch(self, block_id: int) -> None:
        """Take one more reference to a cached block, reviving it if it was free."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.cached_free[block_id]
            self.used_block_ids.add(block_id)
        block.ref_count += 1

    def _release(self, block_id: int, cleaned: list[int]) -> None:
        """Drop one reference; a block that turns clean is appended to `cleaned`."""
        block = self.blocks[block_id]
        if block.ref_count <= 0:  # a bookkeeping bug; never let it corrupt the free lists
            raise RuntimeError(f"double free of KV block {block_id}")
        block.ref_count -= 1
        if block.ref_count:
            return
        self.used_block_ids.remove(block_id)
        if block.hash == NO_HASH:
            heapq.heappush(self.clean_free, block_id)
            cleaned.append(block_id)
            return
        self.cached_free[block_id] = None  # tail: evicted last
        if self.max_cached_free is not None and len(self.cached_free) > self.max_cached_free:
            old, _ = self.cached_free.popitem(last=False)
            self._drop_hash(self.blocks[old])
            heapq.heappush(self.clean_free, old)
            cleaned.append(old)

    def is_clean(self, block_id: int) -> bool:
        """Free and holding no hash: nothing will read its KV before it is written again."""
        block = self.blocks[block_id]
        return block.ref_count == 0 and block.hash == NO_HASH

    def _report_clean(self, cleaned: list[int]) -> None:
        """on_clean(blocks that just turned clean, is_clean): is_clean lets a listener whose
        pages span several blocks check the neighbours."""
        if cleaned and self.on_clean is not None:
            self.on_clean(cleaned, self.is_clean)

    def check(self) -> None:
        """Invariants, for tests: every block is free xor used, refs match, the cache is consistent."""
        clean = set(self.clean_free)
        assert len(clean) == len(self.clean_free), "a block is twice on the clean list"
        assert len(clean) + len(self.cached_free) + len(self.used_block_ids) == self.num_blocks
        assert not (self.used_block_ids & clean or self.used_block_ids & self.cached_free.keys()
                    or clean & self.cached_free.keys())
        if self.max_cached_free is not None:
            assert len(self.cached_free) <= self.max_cached_free
        for block in self.blocks:
            assert (block.ref_count > 0) == (block.block_id in self.used_block_ids), block
            assert (block.block_id in clean) == (block.ref_count == 0 and block.hash == NO_HASH), block
            if block.hash != NO_HASH:
                assert self.hash_to_block_id[block.hash] == block.block_id, block
        assert all(self.blocks[b].hash == h for h, b in self.hash_to_block_id.items())
