"""Ember's compiled CPU kernels (engine/kernels/csrc), loaded once, with the code path to use.

The library is built by `make install` (engine/kernel_library.py). Loading never compiles: when
the file is missing, fails to load or the CPU has none of the paths, `kernels()` returns None,
the reason is logged once, and callers use torch's own kernels. Importing this package does
not import torch.
"""
from __future__ import annotations

import functools
import logging
import os

from engine.kernel_library import ABI, cpu_flags
from engine.kernel_paths import CpuPath, choose_path, runnable_paths

__all__ = ["CpuPath", "available_paths", "cpu_path", "default_path", "kernels"]

log = logging.getLogger(__name__)


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
        log.warning("this CPU lacks %s: Ember's kernels are off, using torch's kernels",
                    ", ".join(torch.ops.ember.missing_features(int(CpuPath.AVX2)).split()))
        return None
    log.info("Ember's CPU kernels: this CPU runs the %s path", best.name)
    return torch.ops.ember


def available_paths() -> list[CpuPath]:
    """Every path this CPU can run, fastest last (tests run each of them): those whose declared
    features /proc/cpuinfo's flags all hold (engine/kernel_paths.py)."""
    return runnable_paths(cpu_flags()) if kernels() is not None else []


def cpu_path() -> CpuPath:
    """The fastest path this CPU runs (NONE without the kernels)."""
    paths = available_paths()
    return paths[-1] if paths else CpuPath.NONE


def default_path() -> CpuPath:
    """The path layers use: the fastest, or the one EMBER_CPU_PATH names (avx2, avx_vnni,
    avx512_vnni), which is how a benchmark runs the AVX2 code on an AVX-512 machine; a path this
    CPU cannot run is refused (ValueError naming the features it lacks), never run."""
    if kernels() is None:
        return CpuPath.NONE
    return choose_path(os.environ.get("EMBER_CPU_PATH", ""), cpu_flags())
