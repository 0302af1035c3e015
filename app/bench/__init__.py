"""`ember bench …`: speed and memory, measured side by side with llama.cpp in one run."""
from __future__ import annotations

import importlib

BENCHES = ("decode", "kv", "throughput", "server")


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks: decode, kv, throughput, server")
    bench_sub = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name in BENCHES:
        module_name = f"app.bench.{name}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue
        module.register(bench_sub)
