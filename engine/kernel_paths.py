"""The CPU code paths of Ember's kernels and the CPU features each one needs.

A path runs only where the CPU has every feature it declares: the paths are not a ladder
(Zen 4 and the Ice Lake Xeons have AVX-512 VNNI without AVX-VNNI; Zen 3 has neither), so a
path is never inferred from a faster one. Feature names are /proc/cpuinfo's. The C++ side
(engine/kernels/csrc/cpu_paths.cpp) holds the same table; tests/kernels/test_cpu_paths.py checks that they agree.
Torch-free: the GUI's fit probe asks whether the kernels can run here.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable


class CpuPath(enum.IntEnum):
    """The SIMD code path of a kernel call (the numbering is the C++ `ember::Path`)."""

    NONE = 0
    AVX2 = 1
    AVX_VNNI = 2
    AVX512_VNNI = 3


# Every path also runs the shared AVX2 code (activation quantization, pointwise ops, preparing
# tiles), hence AVX2, FMA and F16C in each.
_BASE = ("avx2", "fma", "f16c")
FEATURES: dict[CpuPath, tuple[str, ...]] = {
    CpuPath.AVX2: _BASE,
    CpuPath.AVX_VNNI: (*_BASE, "avx_vnni"),
    CpuPath.AVX512_VNNI: (*_BASE, "avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
}


def missing_features(path: CpuPath, flags: Iterable[str]) -> list[str]:
    """The features `path` needs that `flags` (a CPU's feature flags) lack, in declared order."""
    have = set(flags)
    return [f for f in FEATURES[path] if f not in have]


def runnable_paths(flags: Iterable[str]) -> list[CpuPath]:
    """The paths a CPU with these flags can run, fastest last."""
    flags = frozenset(flags)
    return [p for p in FEATURES if not missing_features(p, flags)]


def choose_path(requested: str, flags: Iterable[str]) -> CpuPath:
    """The path to run: the fastest these flags allow, or the one `requested` names (EMBER_CPU_PATH:
    avx2, avx_vnni, avx512_vnni), refused with what the CPU lacks when it cannot run it."""
    flags = frozenset(flags)
    runnable = runnable_paths(flags)
    name = requested.strip().lower()
    if not name:
        return runnable[-1] if runnable else CpuPath.NONE
    names = [p.name.lower() for p in FEATURES]
    if name not in names:
        raise ValueError(f"EMBER_CPU_PATH={name}: not one of {', '.join(names)}")
    path = CpuPath[name.upper()]
    if path not in runnable:
        raise ValueError(f"EMBER_CPU_PATH={name}: this CPU lacks {', '.join(missing_features(path, flags))} "
                         f"(it runs {', '.join(p.name.lower() for p in runnable) or 'none of the paths'})")
    return path
