"""`--synthetic NAME` for `ember bench decode` and `ember bench throughput`: a GGUF with a real
model's layer shapes and random weights, as llama.cpp's own quantizer would give the real one.

A mixture of experts too large for the machine (Qwen3-30B-A3B: 48 layers, 18 GB at Q4_K_M) is
benched on its first few layers: each layer is the real one's shape, so a token reads the bytes
a real layer reads and the kernels see the real widths. The file is written tensor by tensor
(app/bench/lib/gguf_stream.py; experts as Q8_0, small tensors F32), then requantized to Q4_K_M by
`llama_cpp.llama_model_quantize`, so its tensor types are those llama.cpp gives a real Q4_K_M. The
tokenizer is copied from a GGUF of the same family's vocabulary (Qwen's BPE: Qwen2.5-Coder-0.5B).

Built on demand and cached under ~/.cache/ember/synthetic/, keyed by the spec, the layer count
and the tokenizer; the file is built under a `.partial` name and renamed into place when it is
complete, so a killed build never leaves a file that a later run takes for a whole one.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy and gguf load only when a file is built: the CLI imports every bench
    from app.bench.lib.gguf_stream import PlannedTensor

LLAMA_FTYPE_MOSTLY_Q4_K_M = 15
TOKENIZER_FILE = "qwen2.5-coder-0.5b-instruct.gguf"  # Qwen's BPE, as the test models' cache holds it
BUILD_VERSION = 1  # bump when the file's content changes, so older cached files are not reused


@dataclass(frozen=True)
class SyntheticSpec:
    """A named model's shapes: the GGUF architecture, widths, heads, experts and vocabulary
    (`vocab` None: the tokenizer's count), and its real layer count (`real_layers`; the file
    holds `layers` of them unless asked for another number)."""
    name: str
    arch: str
    embd: int
    heads: int
    kv_heads: int
    head_dim: int
    ff: int
    experts: int
    experts_used: int
    expert_ff: int
    vocab: int | None
    rope_theta: float
    rms_eps: float
    context: int
    real_layers: int
    layers: int = 6


SPECS: dict[str, SyntheticSpec] = {
    # Qwen/Qwen3-30B-A3B's config.json (Qwen3-Coder-30B-A3B has the same layer shapes)
    "qwen3moe-30b-a3b": SyntheticSpec(
        "qwen3moe-30b-a3b", "qwen3moe", embd=2048, heads=32, kv_heads=4, head_dim=128, ff=6144, experts=128,
        experts_used=8, expert_ff=768, vocab=151936, rope_theta=1e6, rms_eps=1e-6, context=40960, real_layers=48),
}


def default_cache() -> Path:
    return Path.home() / ".cache" / "ember" / "synthetic"


def default_tokenizer() -> Path:
    """Qwen2.5-Coder-0.5B in the test models' cache (tests/real_models.py fetches it there)."""
    root = os.environ.get("EMBER_TEST_MODEL_CACHE", Path.home() / ".cache" / "ember-test-models")
    return Path(root) / TOKENIZER_FILE


def cached_gguf(spec: SyntheticSpec, layers: int | None = None, tokenizer: Path | None = None,
                cache: Path | None = None, threads: int = 2) -> Path:
    """The cached Q4_K_M file of `spec` with `layers` layers, built first if there is none."""
    layers = layers or spec.layers
    tokenizer = Path(tokenizer or default_tokenizer())
    if not tokenizer.is_file():
        raise FileNotFoundError(f"{tokenizer}: no GGUF to take the tokenizer from; pass --tokenizer-from "
                                "a GGUF with Qwen's vocabulary (e.g. a Qwen2.5 or Qwen3 file)")
    key = repr((spec, layers, tokenizer.name, tokenizer.stat().st_size, BUILD_VERSION))
    cache = Path(cache or default_cache())
    final = cache / f"{spec.name}-{layers}L-{hashlib.sha256(key.encode()).hexdigest()[:10]}.gguf"
    if final.is_file():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    build(spec, layers, tokenizer, final, threads)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux
    print(f"built {final}: {final.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - t0:.0f} s, "
          f"peak RSS of this process {rss:.0f} MiB", flush=True)
    return final


def build(spec: SyntheticSpec, layers: int, tokenizer: Path, final: Path, threads: int = 2) -> None:
    """Write `spec`'s Q8_0 file, requantize it to Q4_K_M beside `final`, then rename it into place.
    The two partial files are overwritten by the next build if this one is killed."""
    q8, q4 = final.with_name(final.name + ".q8_0.partial"), final.with_name(final.name + ".partial")
    try:
        write_q8_0(spec, layers, tokenizer, q8)
        requantize(q8, q4, threads)
        os.replace(q4, final)
    finally:
        for p in (q8, q4):
            p.unlink(missing_ok=True)


def write_q8_0(spec: SyntheticSpec, layers: int, tokenizer: Path, path: Path) -> None:
    """The file in the layout llama.cpp's converter gives, every matrix Q8_0, norms and router F32."""
    from gguf import GGUFWriter

    from app.bench.lib.gguf_stream import copy_tokenizer, write_streamed

    if spec.arch != "qwen3moe":
        raise ValueError(f"no tensor plan for {spec.arch!r} yet")
    w = GGUFWriter(str(path), spec.arch)
    w.add_name(f"synthetic {spec.name} ({layers} of {spec.real_layers} layers, random weights)")
    w.add_context_length(spec.context)
    w.add_embedding_length(spec.embd)
    w.add_block_count(layers)
    w.add_feed_forward_length(spec.ff)
    w.add_head_count(spec.heads)
    w.add_head_count_kv(spec.kv_heads)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_expert_count(spec.experts)
    w.add_expert_used_count(spec.experts_used)
    w.add_expert_feed_forward_length(spec.expert_ff)
    w.add_file_type(7)  # LLAMA_FTYPE_MOSTLY_Q8_0
    vocab = copy_tokenizer(w, tokenizer, spec.vocab)
    write_streamed(w, qwen3moe_tensors(spec, layers, vocab))


def requantize(src: Path, dst: Path, threads: int) -> None:
    """llama.cpp's own quantizer: Q8_0 in, Q4_K_M out (its per-tensor choices, router left F32)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread, params.allow_requantize = LLAMA_FTYPE_MOSTLY_Q4_K_M, threads, True
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src}")


def qwen3moe_tensors(spec: SyntheticSpec, layers: int, vocab: int) -> list[PlannedTensor]:
    """Every tensor of a qwen3moe file, in the converter's order, each a random normal matrix of
    std 1/sqrt(its inputs) (so every activation keeps unit scale), norms 1."""
    from gguf import GGMLQuantizationType as QT

    E, D, N, EF = spec.embd, spec.head_dim, spec.experts, spec.expert_ff
    q, kv = spec.heads * D, spec.kv_heads * D
    out = [_random("token_embd.weight", (vocab, E), QT.Q8_0)]
    for i in range(layers):
        b = f"blk.{i}."
        out += [_ones(b + "attn_norm.weight", E), _random(b + "attn_q.weight", (q, E), QT.Q8_0),
                _random(b + "attn_k.weight", (kv, E), QT.Q8_0), _random(b + "attn_v.weight", (kv, E), QT.Q8_0),
                _random(b + "attn_output.weight", (E, q), QT.Q8_0), _ones(b + "attn_q_norm.weight", D),
                _ones(b + "attn_k_norm.weight", D), _ones(b + "ffn_norm.weight", E),
                _random(b + "ffn_gate_inp.weight", (N, E), QT.F32),
                _random(b + "ffn_gate_exps.weight", (N, EF, E), QT.Q8_0),
                _random(b + "ffn_up_exps.weight", (N, EF, E), QT.Q8_0),
                _random(b + "ffn_down_exps.weight", (N, E, EF), QT.Q8_0)]
    return out + [_ones("output_norm.weight", E), _random("output.weight", (vocab, E), QT.Q8_0)]


ROWS_PER_BLOCK = 4096


def _random(name: str, shape: tuple[int, ...], qtype) -> PlannedTensor:
    import numpy as np

    from app.bench.lib.gguf_stream import PlannedTensor

    cols, rows = shape[-1], int(np.prod(shape[:-1]))
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")

    def blocks():
        rng = np.random.default_rng(seed)
        for start in range(0, rows, ROWS_PER_BLOCK):
            n = min(ROWS_PER_BLOCK, rows - start)
            block = rng.standard_normal((n, cols), dtype=np.float32)
            block *= cols ** -0.5
            yield block
    return PlannedTensor(name, shape, qtype, blocks)


def _ones(name: str, n: int) -> PlannedTensor:
    import numpy as np
    from gguf import GGMLQuantizationType as QT

    from app.bench.lib.gguf_stream import PlannedTensor

    return PlannedTensor(name, (n,), QT.F32, lambda: iter([np.ones((1, n), np.float32)]))


def add_synthetic_args(p) -> None:
    """The flags of a bench that can run a synthetic file instead of --model."""
    p.add_argument("--synthetic", choices=sorted(SPECS), metavar="NAME",
                   help=f"a random-weight Q4_K_M file with a real model's layer shapes, built once and cached "
                        f"under {default_cache()} (one of: {', '.join(sorted(SPECS))})")
    p.add_argument("--layers", type=int, help="with --synthetic: how many of the model's layers the file holds "
                                              "(default 6)")
    p.add_argument("--tokenizer-from", type=Path, metavar="GGUF",
                   help=f"with --synthetic: the GGUF whose tokenizer the file takes (default {default_tokenizer()})")


def bench_model_path(args, cache: Path | None = None) -> str:
    """--model, the synthetic file --synthetic names (built if not cached), or the bundled model."""
    if not getattr(args, "synthetic", None):
        from engine.model_files.bundled import default_model_path

        return args.model or str(default_model_path())
    if args.model:
        raise SystemExit("--model and --synthetic each name a file: pass one of them")
    return str(cached_gguf(SPECS[args.synthetic], args.layers, args.tokenizer_from, cache, args.threads))
