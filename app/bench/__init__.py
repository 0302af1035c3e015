"""`ember bench …`: speed and memory, measured side by side with llama.cpp in one run."""
from __future__ import annotations

BENCHES = ("decode", "kv", "throughput", "server", "turns", "footprint", "grammar", "soak", "soak_gui", "spec", "quant",
           "gemm", "window", "embed", "index_yield", "restart", "rag")


def register(sub) -> None:
    from app.cli import register_commands

    p = sub.add_parser("bench", help="benchmarks: decode, kv, throughput, server, turns, footprint, grammar, "
                                      "soak, soak-gui, spec, quant, gemm, window, embed, index-yield, restart, rag")
    bench_sub = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    register_commands(bench_sub, [f"app.bench.{name}" for name in BENCHES])


def add_model_args(p, backend: str | None = None) -> None:
    """The flags every in-process bench shares: which model, how many threads, device and dtype
    (and `--backend`, defaulting to `backend`, for a bench of one Ember backend)."""
    from engine.backends.cli_args import add_backend_args

    p.add_argument("--model", "-m", help="GGUF file (default: the bundled model)")
    p.add_argument("--threads", "-t", type=int, default=2)
    add_backend_args(p, {"backend": backend}, backend=backend is not None)
