"""Which llama.cpp a benchmark ran: its version, the CPU features its kernels were built for and
where it was loaded from.

A ratio against llama.cpp names the instruction sets on both sides: on one AVX-512 machine a
native build (vpdpbusd on zmm) and an AVX2-only one (what a Zen 3 user runs) are different
baselines. `make llama-cpp-avx2` builds the latter; its printed folder first on PYTHONPATH makes
the benchmarks load it.
"""
from __future__ import annotations

from pathlib import Path


def cpu_features(system_info: str) -> list[str]:
    """The features a `llama_print_system_info()` text reports on ("CPU : AVX2 = 1 | AVX512 = 0 | ..."),
    in its order."""
    on = []
    for field in system_info.split("|"):
        key, sep, value = field.partition("=")
        key = key.rsplit(":", 1)[-1].strip()
        if sep and key and value.strip() == "1" and key not in on:
            on.append(key)
    return on


def describe(llama_cpp) -> str:
    """One line for a benchmark's header: version, features on, folder."""
    info = llama_cpp.llama_print_system_info()
    info = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    folder = Path(llama_cpp.__file__).resolve().parent
    return f"llama.cpp: llama-cpp-python {llama_cpp.__version__}, {' '.join(cpu_features(info)) or 'no CPU features reported'}, from {folder}"
