"""What the engine process holds in memory, for `ember bench soak`: off unless EMBER_DEBUG_HEAP=1.

When it is on, /v1/engine/status gains a `heap` field: live counts of the objects a request
creates (a request that ended and is still counted is a leak), Python's allocated blocks,
tracemalloc's traced bytes when the process runs under PYTHONTRACEMALLOC, and glibc's own
figures (mallinfo2: bytes in use vs. bytes held free in its arenas, which is fragmentation,
not a leak; free chunks whose pages an idle trim gave back still count as free) and what the
idle trims did (allocator.py). `gc.get_objects()` walks the whole heap (tens of ms with torch loaded), so this
runs only when a client asks for the status, never on the engine's step.
"""
from __future__ import annotations

import gc
import os
import sys
import tracemalloc
from collections import Counter
from collections.abc import Iterable

from engine.service.allocator import malloc_stats

ENV = "EMBER_DEBUG_HEAP"
_baseline: tracemalloc.Snapshot | None = None  # the first report's snapshot, under tracemalloc
# the objects one request makes, by class name: engine, server and sampler side
WATCHED = frozenset({"Sequence", "_Request", "RequestOutput", "IncrementalDetokenizer", "StopStringMatcher",
                     "TokenLogprobs", "Job", "ChatChoice", "Queue", "Generator", "Task", "SchedulerOutput"})


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


def live_objects(watched: Iterable[str] = WATCHED) -> dict[str, int]:
    """Counts of the `watched` classes (by name) among the objects the collector tracks (after a
    collection, so that garbage waiting for a cycle collection is not counted)."""
    watched = frozenset(watched)
    gc.collect()
    counts = Counter(name for o in gc.get_objects() if (name := type(o).__name__) in watched)
    return {name: counts.get(name, 0) for name in sorted(watched)}


def heap_report(trimmer=None) -> dict:
    report = {"objects": live_objects(), "gc_tracked": len(gc.get_objects()),
              "py_allocated_blocks": sys.getallocatedblocks(), "malloc": malloc_stats(),
              "trims": trimmer.as_dict() if trimmer is not None else None}
    if tracemalloc.is_tracing():
        global _baseline
        current, peak = tracemalloc.get_traced_memory()
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        if _baseline is None:
            _baseline = snap
        top = snap.compare_to(_baseline, "lineno")[:8]  # growth since the first report
        report["tracemalloc"] = {"current": current, "peak": peak,
                                 "growth": [f"{s.traceback[0].filename}:{s.traceback[0].lineno} "
                                            f"{s.size_diff:+d} B in {s.count_diff:+d}" for s in top]}
    return report
