"""glibc's malloc, seen and trimmed from Python (ctypes): what the engine holds vs. what it keeps free.

Batches of changing shapes free and re-allocate buffers of every size at every step; glibc keeps
freed memory in its arenas for reuse, so the process's RSS climbs in steps that a leak check
finds no object for. `trim()` hands the arenas' free pages back to the system (malloc_trim(0)):
the engine thread calls it once it has been idle a moment (engine_thread.py), never between
steps, so a busy engine pays nothing (measured on the bundled model: each idle trim gave back
10-28 MiB in 2-7 ms). Free chunks smaller than a page stay: that remainder is fragmentation.
Everything here is a no-op where the C library is not glibc.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import time
from functools import cache

# seconds the engine must have been idle before it trims (0 turns trimming off)
IDLE_TRIM_S = float(os.environ.get("EMBER_MALLOC_TRIM_IDLE_S", "0.5"))


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]


@cache
def libc():
    """glibc (2.33+, for mallinfo2), or None (musl, macOS, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        lib.mallinfo2.restype = _Mallinfo2
        lib.malloc_trim.argtypes = [ctypes.c_size_t]
        lib.malloc_trim.restype = ctypes.c_int
        return lib
    except (OSError, AttributeError):
        return None


def malloc_stats() -> dict | None:
    """All arenas: `in_use` bytes the program holds (mmapped chunks included), `free` bytes the
    arenas keep for reuse, `mmapped` the large chunks glibc mapped on their own."""
    lib = libc()
    if lib is None:
        return None
    m = lib.mallinfo2()
    return {"in_use": m.uordblks + m.hblkhd, "free": m.fordblks, "arena": m.arena, "mmapped": m.hblkhd}


def resident_bytes() -> int:
    """This process's RSS from /proc (0 where there is none): one small read, no psutil."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Trimmer:
    """Counts what the idle trims cost and what they give back, for the status route's heap figures."""

    def __init__(self) -> None:
        self.count, self.seconds, self.released = 0, 0.0, 0

    @property
    def enabled(self) -> bool:
        return IDLE_TRIM_S > 0 and libc() is not None

    def trim(self) -> None:
        lib = libc()
        if lib is None:
            return
        rss, t0 = resident_bytes(), time.perf_counter()
        lib.malloc_trim(0)
        self.count += 1
        self.seconds += time.perf_counter() - t0
        self.released += max(0, rss - resident_bytes())

    def as_dict(self) -> dict:
        return {"idle_s": IDLE_TRIM_S, "trims": self.count, "seconds": round(self.seconds, 4),
                "released_bytes": self.released}
