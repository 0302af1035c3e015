"""Where Ember's compiled kernels live: torch-free, so the GUI's fit probe can ask
`kernels_installed`. engine/kernels/build.py builds the library, engine/kernels loads it.
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from engine.kernel_paths import runnable_paths

CSRC = Path(__file__).with_name("kernels") / "csrc"
NAME = "ember_kernels"
# The version of the ops' contract (tile formats, arguments) this Python code speaks; the
# library's `abi()` (csrc/qlinear.cpp) and the stamp the build writes beside it say theirs. A
# library built from older sources (a checkout updated without `make install`) would reject or
# misread today's tiles: it counts as not installed.
ABI = 7


def library_dir() -> Path:
    """Where the library lives: inside the environment, next to the torch it was built against
    (EMBER_KERNELS_DIR, when set, moves it: a second build beside the installed one)."""
    return Path(os.environ.get("EMBER_KERNELS_DIR") or Path(sys.prefix) / "lib" / NAME)


def library_path() -> Path:
    return library_dir() / f"{NAME}.so"


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (Linux; elsewhere: none known). Read once: a
    layer's attention asks for its path every step, and the read took 60 us."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return frozenset()
    return frozenset(line.partition(":")[2].split())


def abi_stamp() -> Path:
    return library_dir() / f"{NAME}.abi"


def kernels_installed() -> bool:
    """The library is built, from sources of this ABI, and this CPU can run one of its paths."""
    try:
        stamp = int(abi_stamp().read_text().strip())
    except (OSError, ValueError):
        return False
    return bool(runnable_paths(cpu_flags())) and library_path().is_file() and stamp == ABI
