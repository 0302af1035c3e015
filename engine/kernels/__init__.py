"""Ember's compiled CPU kernels (engine/kernels/csrc), loaded once, with the code path to use.

The library is built by `make install` (engine/kernel_library.py). Loading never compiles: when
the file is missing, fails to load or the CPU has none of the paths, `kernels()` returns None,
the reason is logged once, and callers use torch's own kernels. Importing this package does
not import torch.
"""
from __future__ import annotations

import enum
import functools
import logging
import os

from engine.kernel_library import ABI

log = logging.getLogger(__name__)


class CpuPath(enum.IntEnum):
    """The SIMD code path of a kernel call (the numbering is the C++ `ember::Path`)."""

    NONE = 0
    AVX2 = 1
    AVX_VNNI = 2
    AVX512_VNNI = 3


@functools.cache
def kernels():
    """torch.ops.ember when the library loads and the CPU can run it, else None (logged once)."""
    import torch

    from engine.kernel_library import library_path

    path = library_path()
    if not path.is_file():
        log.warning("Ember's CPU kernels are not built (%s missing; `make install` builds them): "
                    "using torch's kernels, dense weights, several times slower on a CPU", path)
        return None
    try:
        torch.ops.load_library(str(path))
    except OSError as e:
        log.warning("Ember's CPU kernels failed to load (%s): using torch's kernels", e)
        return None
    abi = torch.ops.ember.abi() if hasattr(torch.ops.ember, "abi") else 1
    if abi != ABI:
        log.warning("Ember's CPU kernels at %s are from other sources (ABI %d, this code needs %d): "
                    "run `make install` to rebuild them; using torch's kernels", path, abi, ABI)
        return None
    best = CpuPath(torch.ops.ember.best_path())
    if best is CpuPath.NONE:
        log.warning("this CPU has neither AVX2 nor VNNI: Ember's kernels are off, using torch's kernels")
        return None
    log.info("Ember's CPU kernels: this CPU runs the %s path", best.name)
    return torch.ops.ember


def cpu_path() -> CpuPath:
    """The fastest path this CPU runs (NONE without the kernels)."""
    ops = kernels()
    return CpuPath.NONE if ops is None else CpuPath(ops.best_path())


def default_path() -> CpuPath:
    """The path layers use: the fastest, or the slower one EMBER_CPU_PATH names (avx2, avx_vnni,
    avx512_vnni), which is how a benchmark runs the AVX2 code on an AVX-512 machine."""
    best = cpu_path()
    name = os.environ.get("EMBER_CPU_PATH", "").strip().upper()
    if not name or best is CpuPath.NONE:
        return best
    if name not in CpuPath.__members__:
        raise ValueError(f"EMBER_CPU_PATH={name.lower()}: not one of avx2, avx_vnni, avx512_vnni")
    return min(CpuPath[name], best)


def available_paths() -> list[CpuPath]:
    """Every path this CPU can run, fastest last (tests run each of them)."""
    return [p for p in CpuPath if CpuPath.NONE < p <= cpu_path()]
