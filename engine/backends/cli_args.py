"""The `--backend`, `--device`, `--dtype`, `--weights` (and `--chat-template`, `--mmproj`) flags of every command that runs a model.

One declaration, so `ember chat`, `generate`, `serve`, `python -m engine serve` (the GUI's engine)
and the benchmarks accept the same values and default to the same `auto`, which
`engine.backends.decide` resolves and logs.
"""
from __future__ import annotations

import argparse

from engine.config import KV_CACHE_DTYPES, WEIGHTS
from engine.model_files.fit import BACKENDS, DEVICES, DTYPES


def add_backend_args(p: argparse.ArgumentParser, defaults: dict | None = None, backend: bool = True,
                     mmproj: bool = True) -> None:
    """`backend=False` for a command that names its backends itself (benchmarks of several);
    `mmproj=False` for one that declares its own `--mmproj` (a bench that refuses it)."""
    d = defaults or {}
    if backend:
        p.add_argument("--backend", choices=BACKENDS, default=d.get("backend", "auto"),
                       help="llama.cpp's kernels or Ember's torch engine (auto: the faster here)")
    p.add_argument("--device", choices=DEVICES, default=d.get("device", "auto"),
                   help="auto: CUDA, then MPS, then the CPU, whichever the model fits")
    p.add_argument("--dtype", choices=DTYPES, default=d.get("dtype", "auto"),
                   help="the torch engine's weights and KV (auto: bf16 where the hardware has it)")
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default=d.get("kv_cache_dtype", "auto"),
                   help="the KV cache's type (auto: --dtype's; q8_0: 8-bit, half of bf16's memory)")
    p.add_argument("--weights", choices=WEIGHTS, default=d.get("weights", "auto"),
                   help="the torch engine's GGUF matrices: kept 4/8-bit for Ember's CPU kernels, or "
                        "dequantized to --dtype (auto: quantized where the kernels run)")
    p.add_argument("--chat-template", default=d.get("chat_template"), metavar="FILE",
                   help="a Jinja chat template file used in place of the model's own (llama.cpp's "
                        "--chat-template-file): for files whose template is missing or wrong")
    if mmproj:
        p.add_argument("--mmproj", default=d.get("mmproj"), metavar="PATH",
                       help="a vision model's projector GGUF (its mmproj file): chats may then carry images "
                            "(the llama.cpp backend)")
    p.add_argument("--speculative", default=d.get("speculative", "off"), metavar="off|ngram|draft:PATH",
                   help="speculative decoding: prompt lookup (ngram) or a draft model of the same vocabulary; "
                        "drafts per step chosen from measured costs, the reply unchanged")
