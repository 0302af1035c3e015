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


def add_model_args(p, backend: str | None = None, no_images: str | None = None) -> None:
    """The flags every in-process bench shares: which model, how many threads, device and dtype
    (and `--backend`, defaulting to `backend`, for a bench of one Ember backend). `no_images`: why
    this bench cannot load a projector; its `--mmproj` then fails in those words, never ignored."""
    from engine.backends.cli_args import add_backend_args

    p.add_argument("--model", "-m", help="GGUF file (default: the bundled model)")
    p.add_argument("--threads", "-t", type=int, default=2)
    add_backend_args(p, {"backend": backend}, backend=backend is not None, mmproj=no_images is None)
    if no_images is not None:
        refuse_flag(p, "--mmproj", no_images)


def refuse_flag(p, flag: str, why: str) -> None:
    """Declare `flag` (taking a value) so that passing it stops the command with `why`."""
    import argparse

    class Refuse(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            parser.error(f"{option_string} is not taken by `{parser.prog}`: {why}")

    p.add_argument(flag, action=Refuse, metavar="PATH", help=f"refused: {why}")
