"""The model's weights moved into one anonymous mapping advised for transparent huge pages.

Decoding one token streams every weight once. From the allocator, 1 GB of weights lies on
260,000 4 KiB pages: a TLB miss every 4 KiB of the stream, and each miss is a page walk the
prefetchers wait on. Where the kernel's THP mode is `madvise` (the default on many
distributions, and these machines'), only memory that asks gets 2 MiB pages; a mapping advised
before its first touch gets them as it is written (no khugepaged delay). `always` gives them
anyway and `never` refuses: then this is a copy for nothing, so it is skipped.

Tensors that share a storage (tied embeddings, a head's rows) keep sharing it: each storage is
copied once and every tensor on it is re-pointed at the same bytes. EMBER_HUGE_PAGES=0 turns it
off (for A/B measurement).
"""
from __future__ import annotations

import logging
import mmap
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
ALIGN = 64  # the CPU allocator's alignment, which the kernels' loads may assume
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str:
    """The bracketed word of the kernel's THP setting ('always', 'madvise', 'never'), or ''."""
    try:
        text = THP_MODE.read_text()
    except OSError:
        return ""
    return text.partition("[")[2].partition("]")[0]


def wanted() -> bool:
    return (os.environ.get("EMBER_HUGE_PAGES", "1") != "0" and hasattr(mmap, "MADV_HUGEPAGE")
            and thp_mode() == "madvise")


def _tensors(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.Tensor]]:
    """(owner, attribute, tensor) of every plain CPU parameter and buffer, shared ones listed each
    time (oneDNN's packed weights are opaque, with no storage to move: they stay where they are)."""
    out = []
    for module in model.modules():
        for name, t in (*module._parameters.items(), *module._buffers.items()):
            if t is not None and t.device.type == "cpu" and t.layout == torch.strided and not t.is_mkldnn:
                out.append((module, name, t))
    return out


def _offsets(storages: dict[int, torch.UntypedStorage]) -> tuple[dict[int, int], int]:
    """Each storage's byte offset in the arena, ALIGN-aligned, and the arena's size."""
    offsets, end = {}, 0
    for key, storage in storages.items():
        offsets[key] = end
        end += -(-storage.nbytes() // ALIGN) * ALIGN
    return offsets, end


def move_to_huge_pages(model: torch.nn.Module, min_bytes: int = HUGE_PAGE) -> int:
    """Copy the model's CPU weights into one THP-advised mapping; the bytes moved (0 when THP
    is not `madvise`, or it is turned off). Storage by storage, so the old copy of each is freed
    as the next is written: call it before anything else holds the tensors (the decoder stack)."""
    if not wanted():
        return 0
    by_storage: dict[int, list[tuple[torch.nn.Module, str, torch.Tensor]]] = {}
    for owner, name, t in _tensors(model):
        by_storage.setdefault(t.untyped_storage().data_ptr(), []).append((owner, name, t))
    storages = {key: group[0][2].untyped_storage() for key, group in by_storage.items()}
    offsets, size = _offsets(storages)
    if size < min_bytes:  # not one huge page's worth: nothing to gain
        return 0
    # Private: a shared anonymous mapping is shmem, which follows shmem_enabled instead.
    area = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    area.madvise(mmap.MADV_HUGEPAGE)  # before the first touch: the pages come huge as written
    whole = torch.frombuffer(area, dtype=torch.uint8)
    skip = -whole.data_ptr() % HUGE_PAGE  # start on a 2 MiB boundary (a multiple of the page size)
    target = whole.untyped_storage()
    for key, group in by_storage.items():
        storage, start = storages.pop(key), skip + offsets[key]
        whole[start:start + storage.nbytes()].copy_(torch.empty(0, dtype=torch.uint8).set_(storage))
        del storage
        for owner, name, t in group:
            moved = torch.empty(0, dtype=t.dtype).set_(target, start // t.element_size() + t.storage_offset(),
                                                       t.shape, t.stride())
            if name in owner._parameters:
                owner._parameters[name].data = moved
            else:
                owner._buffers[name] = moved
        group.clear()
    model._weight_arena = area  # the mapping lives as long as the model
    log.info("weights in transparent huge pages: %.0f MiB", size / 2**20)
    return size
