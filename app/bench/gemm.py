"""`ember bench gemm`: the quantized matrices of a real model, one step's worth, against a plain read.

Decoding one token reads every weight once, so the bound is the machine's memory rate. This bench
runs Ember's `qlinear` on `--rows` rows over the model's own packed matrices (each kind over all
layers in turn, so no matrix is in cache when it runs) and, alternated with it in the same run,
a `sum()` over as many bytes: the ratio says how much of the bus the kernels use, which the
decode figures of `ember bench decode` cannot tell apart from attention and glue. Then the same
kernels on a kind's first matrices that fit in half the last-level cache, called over and over:
their rate with the weights in cache (each call's dispatch from Python included), the bound
their arithmetic sets. A step streaming from memory runs at neither rate alone; where the cached
rate is not well above the plain read, the kernels' instructions, not the bus, are what to cut.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from app.bench.lib.roofline import read_seconds, stream


@dataclass(frozen=True, slots=True)
class KindTiming:
    kind: str  # qkv, o, gate_up, down, head
    count: int  # matrices of this kind
    bits: int
    nbytes: int  # packed codes and scales read per pass
    seconds: float  # median time of one pass over all of them


def packed_bytes(lin) -> int:
    """What one call reads of the layer: its tiles, scales, mins (and bias)."""
    return sum(t.numel() * t.element_size() for t in lin.parameters())


def matrices(model) -> dict[str, list]:
    """The model's QuantLinears by kind, in layer order (the LM head when it is quantized; a
    mixture's experts under gate_up and down)."""
    from engine.layers.quant_linear import QuantLinear

    kinds: dict[str, list] = {"qkv": [], "o": [], "gate_up": [], "down": []}
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        kinds["qkv"].append(attn.qkv_proj)
        kinds["o"].append(attn.o_proj)
        if model.config.num_experts:  # a mixture of experts: every expert's matrices
            kinds["gate_up"] += list(mlp.gate_up)
            kinds["down"] += list(mlp.down)
        else:
            kinds["gate_up"].append(mlp.gate_up_proj)
            kinds["down"].append(mlp.down_proj)
    head = getattr(model, "lm_head", None)
    if head is not None:
        kinds["head"] = [head]
    return {k: v for k, v in kinds.items() if v and all(isinstance(lin, QuantLinear) for lin in v)}


def time_kinds(kinds: dict[str, list], rows: int, repeats: int) -> tuple[list[KindTiming], float]:
    """Per kind the median pass time, and the median time of a sum() over all their bytes,
    the two alternated so that both see the machine in the same state."""
    import torch

    xs = {k: torch.randn(rows, v[0].in_features) for k, v in kinds.items()}
    total = sum(packed_bytes(lin) for v in kinds.values() for lin in v)
    plain = stream(total)
    passes: dict[str, list[float]] = {k: [] for k in kinds}
    reads = []
    for _ in range(repeats):
        for kind, lins in kinds.items():
            t0 = time.perf_counter()
            for lin in lins:
                lin(xs[kind])
            passes[kind].append(time.perf_counter() - t0)
        reads.append(read_seconds(plain))
    timings = [KindTiming(k, len(v), v[0].bits, sum(packed_bytes(lin) for lin in v), statistics.median(passes[k]))
               for k, v in kinds.items()]
    return timings, statistics.median(reads)


def cache_bytes(index: int = 3) -> int:
    """The size of cache level `index` of CPU 0 from sysfs ("32768K"), 0 where unknown."""
    from pathlib import Path

    try:
        text = Path(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size").read_text().strip()
    except OSError:
        return 0
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(text.rstrip("KMG") or 0) * scale


def cached_rate(lins: list, rows: int, budget: int, repeats: int) -> float | None:
    """Bytes per second of the kind's first matrices that fit in `budget` bytes together, run
    pass after pass (the first pass brings them into cache); None when not even one fits."""
    import torch

    chosen, total = [], 0
    for lin in lins:
        nbytes = packed_bytes(lin)
        if total + nbytes > budget:
            break
        chosen.append(lin)
        total += nbytes
    if not chosen:
        return None
    x = torch.randn(rows, chosen[0].in_features)
    passes = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        for lin in chosen:
            lin(x)
        passes.append(time.perf_counter() - t0)
    return total / statistics.median(passes[1:])


def run(args) -> int:
    import torch

    from engine.backends import load_engine
    from engine.config import EngineConfig
    from engine.kernels import default_path
    from engine.model_files.bundled import default_model_path

    path = args.model or str(default_model_path())
    torch.set_num_threads(args.threads)
    engine, _ = load_engine(EngineConfig(model_path=path, num_threads=args.threads), "torch", "cpu")
    kinds = matrices(engine.runner.model)
    if not kinds:
        print("no quantized matrices: Ember's CPU kernels are not built (run `make install`)")
        return 1
    print(f"model {path}\nthreads {args.threads}, {args.rows} row(s), {default_path().name} path, "
          f"median of {args.repeats}")
    print(f"{'matrices':<10}{'count':>6}{'bits':>6}{'MiB':>9}{'ms':>9}{'GB/s':>8}{'roofline':>10}{'in cache':>10}")
    timings, read = time_kinds(kinds, args.rows, args.repeats)
    total_b = sum(t.nbytes for t in timings)
    rate = total_b / read  # the plain read of all the kinds' bytes: no kernel streams faster
    budget = cache_bytes() // 2
    for t in timings:
        cached = cached_rate(kinds[t.kind], args.rows, budget, args.repeats) if budget else None
        print(f"{t.kind:<10}{t.count:>6}{t.bits:>6}{t.nbytes / 2**20:>9.1f}{t.seconds * 1e3:>9.2f}"
              f"{t.nbytes / t.seconds / 1e9:>8.1f}{t.nbytes / t.seconds / rate:>10.0%}"
              + (f"{cached / 1e9:>10.1f}" if cached else f"{'-':>10}"))
    total_s = sum(t.seconds for t in timings)
    print(f"{'all':<10}{'':>12}{total_b / 2**20:>9.1f}{total_s * 1e3:>9.2f}{total_b / total_s / 1e9:>8.1f}")
    print(f"{'sum()':<22}{total_b / 2**20:>9.1f}{read * 1e3:>9.2f}{total_b / read / 1e9:>8.1f}")
    print(f"kernels / plain read: {total_s / read:.2f}x the time")
    print(f"in cache: GB/s of each kind's first matrices that fit in half the {budget * 2 / 2**20:.0f} MiB "
          f"last-level cache, called pass after pass ('-': none fits)" if budget else
          "in cache: not measured (the last-level cache's size is unknown)")
    return 0


def register(bench_sub) -> None:
    p = bench_sub.add_parser("gemm", help="the model's quantized matrices at N rows vs a plain read of their bytes")
    p.add_argument("--model", "-m", help="GGUF file (default: the bundled model)")
    p.add_argument("--threads", "-t", type=int, default=2)
    p.add_argument("--rows", type=int, default=1, help="activation rows (1 = a decode step)")
    p.add_argument("--repeats", type=int, default=9)
    p.set_defaults(func=run)
