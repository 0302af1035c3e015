"""The CUDA check: run on a machine with an sm80+ GPU, in a few minutes, what CI cannot.

    python tools/cuda_check.py [--model GGUF] [--out DIR]

1. the CUDA tests (tests/test_int4_linear.py: tinygemm's layer against a float64 reference, a
   whole model 4-bit on the GPU against bf16 and the CPU);
2. Int4Linear (tinygemm) against dense bf16 on Qwen2.5-Coder-1.5B's matrices, 28 layers, at
   1, 8, 32 and 512 rows: the time of one forward pass through the linear layers;
3. with --model, `ember bench decode`-style prefill and decode tok/s of the torch engine on the
   GPU, weights 4-bit (`--weights quantized`) and dense bf16, side by side.
Figures go to stdout and DIR/cuda_check.json. On a GPU machine without Ember installed, run it
from the checkout with PYTHONPATH=. and carry the wheels it lacks (gguf: `pip download
--no-deps gguf==0.19.0`); torch, numpy, tokenizers, jinja2 and pytest are in the usual images.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
QWEN_1_5B = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)}


def gpu_time(fn, reps: int = 20) -> float:
    """Median seconds of fn() on the GPU, CUDA events, after warm-up."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return sorted(times)[len(times) // 2]


def bench_layers(rows: list[int]) -> list[dict]:
    from engine.kernels.pack import QuantWeight
    from engine.layers.int4_linear import Int4Linear

    out = []
    for M in rows:
        t4 = tdense = 0.0
        for N, K in QWEN_1_5B.values():
            q = torch.randint(0, 16, (N, K), dtype=torch.uint8, device="cuda")
            d = torch.rand(N, K // 32, device="cuda") * 0.01
            w = QuantWeight(4, 32, q, d, -8 * d)
            lin, dense = Int4Linear(w), w.dequantize().to(torch.bfloat16)
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            t4 += 28 * gpu_time(lambda: lin(x))
            tdense += 28 * gpu_time(lambda: torch.nn.functional.linear(x, dense))
            del lin, dense
        out.append({"rows": M, "int4_ms": t4 * 1e3, "bf16_ms": tdense * 1e3, "speedup": tdense / t4})
        print(f"rows {M:5d}: 4-bit {t4 * 1e3:8.2f} ms   bf16 {tdense * 1e3:8.2f} ms   {tdense / t4:5.2f}x", flush=True)
    return out


def bench_model(path: str, prompt_tokens: int = 512, new_tokens: int = 64) -> list[dict]:
    from app.bench.decode import bench_ember, make_prompt
    from engine.backends import load_engine
    from engine.config import EngineConfig

    out = []
    for weights in ("quantized", "dense"):
        engine, decision = load_engine(EngineConfig(model_path=path, device="cuda", dtype="bfloat16", weights=weights,
                                                    max_prefill_chunk=prompt_tokens,
                                                    enable_prefix_caching=False), "torch", "cuda")
        prompt = make_prompt(engine.tokenizer.encode, prompt_tokens)
        bench_ember(engine, prompt[:32], 8)
        runs = [bench_ember(engine, prompt, new_tokens) for _ in range(3)]
        pp, tg = (sorted(r[i] for r in runs)[1] for i in (0, 1))
        out.append({"weights": weights, "prefill_tok_s": pp, "decode_tok_s": tg,
                    "gpu_mem_gib": torch.cuda.max_memory_allocated() / 2**30})
        print(f"{weights:10s} prefill {pp:9.1f} tok/s   decode {tg:7.1f} tok/s", flush=True)
        del engine
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a GGUF file for the end-to-end figures")
    ap.add_argument("--out", default=".", help="where cuda_check.json goes")
    args = ap.parse_args()
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)):
        print("no sm80+ CUDA GPU here: nothing to check")
        return 2
    sys.path.insert(0, str(ROOT))
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    print(f"{report['device']}, torch {report['torch']}", flush=True)
    t0 = time.perf_counter()
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                            str(ROOT / "tests" / "test_int4_linear.py")], cwd=ROOT)
    report["tests_rc"] = tests.returncode
    report["layers"] = bench_layers([1, 8, 32, 512])
    if args.model:
        report["model"] = {"path": args.model, "runs": bench_model(args.model)}
    report["seconds"] = time.perf_counter() - t0
    Path(args.out, "cuda_check.json").write_text(json.dumps(report, indent=2))
    return tests.returncode


if __name__ == "__main__":
    raise SystemExit(main())
