"""llama.cpp's KV for the llama.cpp runner, sized from the chats actually open, not reserved whole.

llama.cpp allocates and clears a context's KV buffer (and sizes its compute buffers by it) when
the context is made, so the only way for that memory to follow use is the context's size itself.
The runner starts with a small context and, when a step needs more cells than it has, this
re-creates it larger (a quarter more than needed, so that growing costs a few copies in all, at
most the block manager's pool, so the engine's admission never asks for cells llama.cpp could
not have; doubling would leave up to half of it unused); when nothing runs and the idle slots
hold far fewer cells than it has, it re-creates it smaller. Every slot's cells move across with
`llama_state_seq_get_data` / `set_data` (a copy of the KV bytes, no recompute), so the prompt
cache survives a resize. Cells a slot shared with another (`llama_memory_seq_cp`) are copied
once per slot; the runner already counts them once per slot.

Cells are only ever appended (issue 19: same request, same answer). ggml's CPU flash attention
visits a row's cells in cell order, so a sequence's logits depend on other chats only if its cells
are out of position order, which happens when llama.cpp fills a hole that a freed sequence left
below them (it searches for free cells from the lowest freed one). So nothing is freed: cells a
slot gives up are handed to a reserved "grave" sequence that no row attends to (`bury`), every new
token lands at `head`, and when the head reaches the end the context is re-created (`make_room`),
which restores each slot's cells contiguous and in order and drops the grave.
"""
from __future__ import annotations

import ctypes
import logging
import mmap

log = logging.getLogger(__name__)

PAD = 256  # llama.cpp pads n_ctx to a multiple of 256 cells
MIN_CELLS = 512  # the context a runner starts with (and shrinks back to)
FA_TILE_ROWS = 64  # GGML_FA_TILE_Q: ggml's CPU flash attention tiles ubatches of this many rows


def round_cells(n: int) -> int:
    return max(PAD, -(-n // PAD) * PAD)


# EngineConfig.kv_cache_dtype -> ggml's type of llama.cpp's KV cells (GGML_TYPE_BF16 is 30)
KV_TYPES = {"auto": 1, "float16": 1, "float32": 0, "bfloat16": 30, "q8_0": 8}


def kv_cache_type(name: str, flash_attn: bool) -> int:
    """llama.cpp's cache type for the setting (auto: f16, its default); a quantized V cache
    needs flash attention, as llama.cpp's own server says."""
    if name == "q8_0" and not flash_attn:
        raise RuntimeError("a q8_0 KV cache on llama.cpp needs flash attention")
    return KV_TYPES[name]


class ResizableContext:
    """One llama_context (`ctx`, `mem`, `cells`) that `grow` and `shrink` re-create."""

    def __init__(self, ll, model, cparams, max_cells: int, min_cells: int = MIN_CELLS) -> None:
        self._ll, self._model, self._cparams = ll, model, cparams
        self.max_cells = max_cells
        self.min_cells = min(round_cells(min_cells), max_cells)
        self.num_resizes = 0
        self.pad, self.grave = cparams.n_seq_max - 2, cparams.n_seq_max - 1  # reserved sequence ids
        self.ctx = self._create(self.min_cells)
        self.cells = self.min_cells
        self.head = 0  # cells below it all hold a sequence (live, idle or the grave); none above

    def _create(self, cells: int):
        self._cparams.n_ctx = cells
        ctx = self._ll.llama_init_from_model(self._model, self._cparams)
        if not ctx:
            raise MemoryError(f"llama.cpp could not create a context of {cells} cells "
                              "(out of memory? try a smaller --max-model-len or KV fraction)")
        self.mem = self._ll.llama_get_memory(ctx)
        return ctx

    def target(self, needed: int) -> int:
        """The size to grow to for `needed` cells: a quarter more, within [min, max]."""
        return min(self.max_cells, max(round_cells(needed + needed // 4), self.min_cells))

    def bury(self, seq_id: int, p0: int = 0) -> None:
        """Give up seq_id's cells from position p0 on without freeing them (module docstring)."""
        self._ll.llama_memory_seq_cp(self.mem, seq_id, self.grave, p0, -1)
        self._ll.llama_memory_seq_rm(self.mem, seq_id, p0, -1)

    def placed(self, n: int, padded: bool) -> None:
        """llama.cpp put a batch of n tokens at the head (the cells above it are all free); the
        padding row's cell (the runner's `pad` sequence, no one else's) goes to the grave."""
        self.head += n
        if padded:
            self.bury(self.pad)

    def reset(self) -> None:
        """No sequence holds a cell: empty the context (the grave too) and start again at cell 0,
        so a chat that comes next lies where it would in a fresh context (the same logits as
        llama.cpp alone: without flash attention the sums over cells still depend on where they
        start)."""
        self._ll.llama_memory_clear(self.mem, False)
        self.head = 0

    def make_room(self, num_new: int, needed: int, slots: dict[int, int]) -> bool:
        """Room for num_new cells at the head, re-creating the context (larger if `needed`, the
        cells the `slots` hold (slot: cells) plus num_new, asks for it) when the head is near the end; False
        when `needed` exceeds the pool (the caller evicts idle slots and asks again)."""
        if self.head + num_new <= self.cells:
            return True
        if needed > self.max_cells:
            return False
        self._resize(max(self.cells, self.target(needed)), slots)
        return self.head + num_new <= self.cells

    def shrink(self, needed: int, slots: dict[int, int]) -> None:
        """Nothing runs: give back the cells beyond what the idle slots hold, when that halves it."""
        size = max(self.min_cells, round_cells(needed))
        if 2 * size <= self.cells:
            self._resize(size, slots)

    def _resize(self, cells: int, slots: dict[int, int]) -> None:
        ll = self._ll
        saved = []
        for slot in slots:  # the KV of every slot that holds cells, as bytes
            size = ll.llama_state_seq_get_size(self.ctx, slot)
            # An anonymous mapping, not the heap: unmapped as soon as it is restored, so the copies
            # never stay behind in malloc's arenas (they are MiBs each, under its mmap threshold).
            m = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE)
            buf = (ctypes.c_uint8 * size).from_buffer(m)
            if ll.llama_state_seq_get_data(self.ctx, buf, size, slot) != size:
                raise RuntimeError(f"llama.cpp could not save slot {slot} to resize the context")
            saved.append((slot, m, buf, size))
        old, carried = self.cells, len(saved)
        ll.llama_free(self.ctx)  # before the new one: the peak is one KV buffer plus the copies
        self.ctx, self.cells, self.head = self._create(cells), cells, 0
        while saved:  # into a context with no holes: each slot's cells contiguous, from the head
            slot, m, buf, size = saved.pop(0)
            if not ll.llama_state_seq_set_data(self.ctx, buf, size, slot):
                raise RuntimeError(f"llama.cpp could not restore slot {slot} after resizing the context")
            del buf
            m.close()
            self.head += slots[slot]  # its cells (not its positions: an M-RoPE image has fewer)
        self.num_resizes += 1
        log.info("llama.cpp context: %d -> %d KV cells (%d slots carried over)", old, cells, carried)

    def close(self) -> None:
        if self.ctx:
            self._ll.llama_free(self.ctx)
            self.ctx = None
