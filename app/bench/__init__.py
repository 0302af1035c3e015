"""`ember bench …`: speed and memory, measured side by side with llama.cpp in one run."""
from __future__ import annotations

BENCHES = ("decode", "kv", "throughput", "server", "turns")


def register(sub) -> None:
    from app.cli import register_commands

    p = sub.add_parser("bench", help="benchmarks: decode, kv, throughput, server, turns")
    bench_sub = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    register_commands(bench_sub, [f"app.bench.{name}" for name in BENCHES])


def add_model_args(p) -> None:
    """The flags every in-process bench shares: which model, how many threads, which dtype."""
    p.add_argument("--model", "-m", help="GGUF file (default: the bundled model)")
    p.add_argument("--threads", "-t", type=int, default=2)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
