"""`ember bench …`: speed and memory, measured side by side with llama.cpp in one run."""
from __future__ import annotations

BENCHES = ("decode", "kv", "throughput", "server")


def register(sub) -> None:
    from app.cli import register_commands

    p = sub.add_parser("bench", help="benchmarks: decode, kv, throughput, server")
    bench_sub = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    register_commands(bench_sub, [f"app.bench.{name}" for name in BENCHES])
