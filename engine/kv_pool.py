"""The torch runner's paged KV pool: reserved up front, committed by the OS on first write,
and handed back to it when blocks turn clean, so resident KV follows the tokens the chats hold.

On a CPU each layer's K and V pools ([num_blocks, B, n_kv, hd], contiguous, as the kernels and
the gather read them) are views into one private anonymous mapping. Its pages read as zeros and
cost nothing until written (what `torch.zeros` gave, without touching the whole pool at load),
and `madvise(MADV_DONTNEED)` on a clean block's pages makes them zero-fill-on-demand again: the
memory goes back to the system and the block reads as zeros, never as another chat's KV or as
garbage (SDPA's masked positions multiply V by 0, and 0 × NaN would be NaN). A page is given
back only when every block it overlaps is clean (a block need not be a whole number of pages).
Huge pages are declined so that one written token commits 4 KiB, not 2 MiB.

On a GPU the pool is `torch.zeros` as before: device memory cannot be committed lazily here.
"""
from __future__ import annotations

import mmap
from collections.abc import Callable, Iterable

import torch

PAGE = mmap.PAGESIZE


def _runs(ids: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted ids as half-open runs of consecutive values: [3, 4, 5, 9] -> [(3, 6), (9, 10)]."""
    runs: list[tuple[int, int]] = []
    for i in sorted(set(ids)):
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


class KVPool:
    """`caches[layer] = (k, v)`; `give_back(block_ids, is_clean)` is the block manager's on_clean."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.num_blocks, self.dtype, self.shape = num_blocks, dtype, shape
        self.block_bytes = block_size * num_kv_heads * head_dim * dtype.itemsize  # one block, one tensor
        self._map: mmap.mmap | None = None
        if device.type != "cpu":
            self.caches = [(torch.zeros(shape, dtype=dtype, device=device),
                            torch.zeros(shape, dtype=dtype, device=device)) for _ in range(num_layers)]
            return
        stride = -(-num_blocks * self.block_bytes // PAGE) * PAGE  # each tensor starts on a page
        self._map = mmap.mmap(-1, 2 * num_layers * stride, flags=mmap.MAP_PRIVATE)
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            self._map.madvise(mmap.MADV_NOHUGEPAGE)
        self._offsets = [i * stride for i in range(2 * num_layers)]
        count = num_blocks * self.block_bytes // dtype.itemsize
        tensors = [torch.frombuffer(self._map, dtype=dtype, count=count, offset=o).view(shape)
                   for o in self._offsets]
        self.caches = list(zip(tensors[0::2], tensors[1::2]))

    @property
    def lazy(self) -> bool:
        """Whether pages are committed on first write and can be given back (the CPU pool)."""
        return self._map is not None

    def pages_to_give_back(self, block_ids: Iterable[int], is_clean: Callable[[int], bool]) -> list[tuple[int, int]]:
        """Byte ranges (relative to a tensor's start, page-aligned) of the pages that hold only
        clean blocks and overlap one of `block_ids`."""
        bb, nb = self.block_bytes, self.num_blocks
        pages: list[int] = []
        for b0, b1 in _runs(block_ids):
            for p in range(b0 * bb // PAGE, -(-b1 * bb // PAGE)):
                first, last = p * PAGE // bb, min(((p + 1) * PAGE - 1) // bb, nb - 1)
                if all(b0 <= b < b1 or is_clean(b) for b in range(first, last + 1)):
                    pages.append(p)
        return [(p0 * PAGE, (p1 - p0) * PAGE) for p0, p1 in _runs(pages)]

    def give_back(self, block_ids: Iterable[int], is_clean: Callable[[int], bool],
                  layers: Iterable[int] | None = None) -> None:
        """Return the pages of clean blocks to the OS in every layer's K and V (or only those of
        `layers`: the sliding-window layers' blocks out of their window); they read as zeros."""
        if self._map is None:
            return
        bases = self._offsets if layers is None else [self._offsets[2 * i + kv] for i in layers for kv in (0, 1)]
        for start, length in self.pages_to_give_back(block_ids, is_clean):
            for base in bases:
                self._map.madvise(mmap.MADV_DONTNEED, base + start, length)

    def read_blocks(self, block_ids: list[int], layers: list[int] | None = None) -> list:
        """Copies of blocks for the disk tier: per block, K then V of every layer (or of `layers`),
        as one row of bytes (a numpy view of a CPU tensor that nothing else writes); one gather per tensor."""
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.caches[0][0].device)
        caches = self.caches if layers is None else [self.caches[i] for i in layers]
        if not caches:  # every layer slides: a block out of the window keeps nothing
            return [bytes() for _ in block_ids]
        rows = torch.stack([t.index_select(0, idx) for kv in caches for t in kv], 1)
        rows = rows.view(torch.uint8).reshape(len(block_ids), -1).cpu()
        return [row.numpy() for row in rows]

    def write_block(self, block_id: int, payload, layers: list[int] | None = None) -> None:
        """A row read_blocks made (of the same `layers`) back into block_id; ValueError for a wrong size."""
        caches = self.caches if layers is None else [self.caches[i] for i in layers]
        expected = 2 * len(caches) * self.block_bytes
        if memoryview(payload).nbytes != expected:
            raise ValueError(f"a KV block of {memoryview(payload).nbytes} bytes where this pool's are {expected}")
        if not caches:
            return
        src = torch.frombuffer(payload, dtype=torch.uint8).view(self.dtype).view(2 * len(caches), *self.shape[1:])
        for i, (k, v) in enumerate(caches):
            k[block_id].copy_(src[2 * i])
            v[block_id].copy_(src[2 * i + 1])

    def resident_bytes(self) -> int:
        """Bytes of the pool in memory now (mincore(2) over its pages; the kernel may merge the
        mapping with its neighbours, so /proc's per-mapping Rss would count theirs); 0 where
        mincore is not there. What `ember bench window` reports."""
        if self._map is None:
            return 0
        import ctypes

        try:
            mincore = ctypes.CDLL(None, use_errno=True).mincore
        except (OSError, AttributeError):
            return 0
        length = len(self._map)
        vec = (ctypes.c_ubyte * (-(-length // PAGE)))()
        addr = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(self._map)))
        if mincore(addr, ctypes.c_size_t(length), vec) != 0:
            return 0
        return sum(v & 1 for v in vec) * PAGE

    def close(self) -> None:
        """Drop the tensors; the mapping goes with the last view of it."""
        self.caches = []
        self._map = None
