"""The llama.cpp runner's prompt cache on disk: a slot's cells outlive the engine.

When a sequence's slot goes idle, its cells are saved (`llama_state_seq_get_data`: a copy on the
engine thread, written by the disk tier's writer, engine/kv_disk/store.py) under the chain hash of
its leading full blocks, the same key Ember's own engine uses (engine/block_manager.py), salted
with the model file, llama.cpp's version and the cache's type. A new prompt that no slot serves
looks for the longest of its full-block prefixes on disk; the state is restored into a free slot
at the context's head (`set_data`: contiguous, in order, as the runner's exactness needs), and
the cells past the prefix go to the grave. A file that fails its checks, or that llama.cpp
refuses, is deleted and the prompt computed.
"""
from __future__ import annotations

import ctypes
import logging
import struct
from pathlib import Path

from engine.block_manager import hash_block_tokens
from engine.block_pool import NO_HASH
from engine.config import EngineConfig
from engine.kv_disk.identity import model_identity, salt
from engine.kv_disk.lock import FolderBusy
from engine.kv_disk.store import KVDiskStore

log = logging.getLogger(__name__)

COUNT = struct.Struct("<I")  # the payload: the cells the state holds, then llama.cpp's state bytes
ALIAS = 0xFFFFFFFF  # a COUNT that marks a payload naming another key: a longer state that holds these blocks


def prefix_hashes(seq, block_size: int, num_blocks: int) -> list[int]:
    """The chained hashes of seq's first num_blocks full blocks (memoised on the seq)."""
    B, hashes = block_size, seq.block_hashes
    for i in range(len(hashes), num_blocks):
        hashes.append(hash_block_tokens(hashes[i - 1] if i else NO_HASH, seq.token_ids[i * B:(i + 1) * B]))
    return hashes[:num_blocks]


class SlotDisk:
    def __init__(self, store: KVDiskStore, block_size: int, min_match: int) -> None:
        self.store, self.block_size, self.min_match = store, block_size, min_match

    def save(self, ll, ctx, slot: int, seq, num_cells: int) -> None:
        """Keep a copy of slot's cells (the first num_cells tokens of seq) for after a restart."""
        num_blocks = num_cells // self.block_size
        if num_blocks * self.block_size < self.min_match:
            return
        hashes = prefix_hashes(seq, self.block_size, num_blocks)
        key = hashes[-1]
        if self.store.wants(key):
            size = ll.llama_state_seq_get_size(ctx, slot)
            payload = bytearray(COUNT.size + size)
            COUNT.pack_into(payload, 0, num_cells)
            if ll.llama_state_seq_get_data(ctx, (ctypes.c_uint8 * size).from_buffer(payload, COUNT.size),
                                           size, slot) == size:
                self.store.put(key, payload)
        # the prompt's own blocks lead there too: a turn that departs inside the reply (Regenerate,
        # an edited answer, a client that sends the prompt again) finds them, not only one that
        # holds the whole reply
        prompt_blocks = min(seq.num_prompt_tokens, num_cells) // self.block_size
        if 0 < prompt_blocks < num_blocks and prompt_blocks * self.block_size >= self.min_match \
                and self.store.has(key) and self.store.wants(hashes[prompt_blocks - 1]):
            self.store.put(hashes[prompt_blocks - 1], COUNT.pack(ALIAS) + key.to_bytes(16, "little"))

    def match(self, seq, limit: int) -> tuple[int, int]:
        """(tokens, key) of the longest full-block prefix of seq (at most limit tokens) on disk."""
        B = self.block_size
        hashes = prefix_hashes(seq, B, limit // B)
        for i in range(len(hashes), 0, -1):
            if i * B < self.min_match:
                break
            if self.store.contains(hashes[i - 1]):
                return i * B, hashes[i - 1]
        return 0, NO_HASH

    def restore(self, ll, context, slot: int, key: int, make_room) -> int:
        """Read key's state into the (empty) slot at the context's head; the cells it holds, or
        0 (nothing restored). make_room(n) makes room for n cells at the head first."""
        payload = self.store.get(key)
        if payload is not None and len(payload) == COUNT.size + 16 and COUNT.unpack_from(payload)[0] == ALIAS:
            alias, key = key, int.from_bytes(payload[COUNT.size:], "little")
            if (payload := self.store.get(key)) is None:
                self.store.discard(alias)  # the state it named was evicted
        if payload is None or len(payload) < COUNT.size:
            return 0
        (cells,), size = COUNT.unpack_from(payload), len(payload) - COUNT.size
        make_room(cells)
        if ll.llama_state_seq_set_data(context.ctx, (ctypes.c_uint8 * size).from_buffer(payload, COUNT.size),
                                       size, slot) != size:
            log.warning("KV disk tier: llama.cpp refused a saved state; deleted, its prefix is computed again")
            ll.llama_memory_seq_rm(context.mem, slot, 0, -1)
            self.store.discard(key)
            return 0
        context.placed(cells, False)
        return cells

    def claim(self, runner, seq, num_tokens: int) -> int:
        """Give seq a free slot of the llama.cpp runner with its longest full-block prefix read
        back from disk; how many tokens it holds (0: none)."""
        n, key = self.match(seq, num_tokens)
        if (got := runner._slots.acquire()) is None:
            return 0
        slot, dirty = got
        if dirty:
            runner._clear(slot)
        cells = self.restore(runner._ll, runner._context, slot, key, runner._make_room)
        if cells < n:  # not restored (a bad file: deleted), or fewer cells than the key says
            runner._clear(slot)
            runner._slots.park(slot, [])
            return 0
        runner._context.bury(slot, n)  # the cells past the prefix
        runner._slot_of[seq.seq_id], runner._live[slot], runner._kv_len[slot] = slot, seq, n
        return n

    def close(self) -> None:
        self.store.close()


def open_slot_disk(config: EngineConfig, ll, flash_attn: bool, n_gpu_layers: int, min_match: int) -> SlotDisk | None:
    if not config.kv_disk_dir or not config.enable_prefix_caching:
        return None
    identity = "\0".join(str(f) for f in ("llama.cpp", model_identity(config.model_path), ll.__version__,
                                          config.kv_cache_dtype, flash_attn, n_gpu_layers))
    try:
        store = KVDiskStore(Path(config.kv_disk_dir), salt(identity, config.block_size),
                            int(config.kv_disk_budget_gib * 2**30), label=str(Path(config.model_path).resolve()))
    except (FolderBusy, OSError) as e:
        log.warning("KV disk tier off for %s: %s", config.model_path, e)
        return None
    return SlotDisk(store, config.block_size, min_match)
