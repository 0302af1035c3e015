"""The CUDA check: run on a machine with an sm80+ GPU, in a few minutes, what CI cannot.

    python tools/cuda_check.py [--model GGUF | --qwen-shapes] [--hf] [--out DIR]

1. the CUDA tests (tests/kernels/test_int4_linear.py: tinygemm's layer against a float64 reference, a
   whole model 4-bit on the GPU against bf16 and the CPU);
2. Int4Linear (tinygemm) against dense bf16 on Qwen2.5-Coder-1.5B's matrices, 28 layers, at
   1, 8, 32 and 512 rows: the time of one forward pass through the linear layers;
3. with --model, `ember bench decode`-style prefill and decode tok/s of the torch engine on the
   GPU, weights 4-bit (`--weights quantized`) and dense bf16, side by side, and 64 chats at once;
   --qwen-shapes writes that model first: Qwen2.5-1.5B's shapes with random Q4_K weights (the
   real 1.04 GiB file cannot travel; speed does not depend on the values);
4. the card's copy bandwidth, and the decode rate it allows for the model's bytes (the roofline);
5. with --hf, Hugging Face transformers' generate in bf16 on a model of the same shapes.
Figures go to stdout and DIR/cuda_check.json. On a GPU machine without Ember installed, run it
from the checkout with PYTHONPATH=. and carry the wheels it lacks (gguf: `pip download
--no-deps gguf==0.19.0`); torch, numpy, tokenizers, jinja2 and pytest are in the usual images.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from cuda_engine import load_engine_on_cuda  # tools/, beside this script

ROOT = Path(__file__).resolve().parents[1]
QWEN_1_5B = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)}
# Qwen2.5-1.5B(-Coder)'s config: 28 layers, hidden 1536, 12 heads, 2 KV heads, FFN 8960, vocab 151,936
QWEN_1_5B_MODEL = dict(n_layers=28, hidden=1536, n_heads=12, n_kv_heads=2, ffn=8960, vocab=151936,
                       rope_theta=1e6, rms_eps=1e-6)


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
    """Qwen2.5-1.5B's 28 layers of matrices at M rows: tinygemm (the 4-bit path), Int4Linear's
    dense path (dequantize per call, then bf16), and bf16 on a dense copy kept (memory x4):
    where the first two cross is where Int4Linear should switch (DENSE_ROWS)."""
    from engine.weights.quant_weight import QuantWeight
    from engine.layers import int4_linear
    from engine.layers.int4_linear import Int4Linear

    out = []
    for M in rows:
        t4 = tdq = tdense = 0.0
        for N, K in QWEN_1_5B.values():
            q = torch.randint(0, 16, (N, K), dtype=torch.uint8, device="cuda")
            d = torch.rand(N, K // 32, device="cuda") * 0.01
            w = QuantWeight(4, 32, q, d, -8 * d)
            lin, dense = Int4Linear(w), w.dequantize().to(torch.bfloat16)
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            saved = int4_linear.DENSE_ROWS
            try:
                int4_linear.DENSE_ROWS = 1 << 30
                t4 += 28 * gpu_time(lambda: lin(x))
                int4_linear.DENSE_ROWS = 0
                tdq += 28 * gpu_time(lambda: lin(x))
            finally:
                int4_linear.DENSE_ROWS = saved
            tdense += 28 * gpu_time(lambda: torch.nn.functional.linear(x, dense))
            del lin, dense
        out.append({"rows": M, "int4_ms": t4 * 1e3, "dequant_bf16_ms": tdq * 1e3, "bf16_ms": tdense * 1e3})
        print(f"rows {M:5d}: tinygemm {t4 * 1e3:8.2f} ms   dequantize+bf16 {tdq * 1e3:8.2f} ms   "
              f"bf16 kept {tdense * 1e3:8.2f} ms", flush=True)
    return out


def write_qwen_shapes(path: Path) -> str:
    """A GGUF of Qwen2.5-1.5B's shapes, random Q4_K matrices (tests/gguf_factory.py's writer)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from gguf import GGMLQuantizationType as QT
    from gguf_factory import bpe_vocab, write_tiny_model

    c = QWEN_1_5B_MODEL
    if path.is_file():  # written by an earlier run on this machine
        return str(path)
    t0 = time.perf_counter()
    write_tiny_model(path, arch="qwen2", n_layers=c["n_layers"], hidden=c["hidden"], n_heads=c["n_heads"],
                     n_kv_heads=c["n_kv_heads"], ffn=c["ffn"], ctx=4096, qtype=QT.Q4_K, tied=True,
                     rope_theta=c["rope_theta"], rms_eps=c["rms_eps"],
                     extra_tokens=c["vocab"] - len(bpe_vocab(200)[0]))
    print(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t0:.0f} s", flush=True)
    return str(path)


def copy_bandwidth(gib: float = 4.0) -> float:
    """Bytes per second a device-to-device copy moves, reads and writes counted."""
    a = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() / gpu_time(lambda: b.copy_(a), reps=10)


def bench_chats(engine, prompt: list[int], chats: int, new_tokens: int) -> float:
    """Aggregate decode tok/s of `chats` greedy replies at once (prompts distinct, so no prefix reuse)."""
    from engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    for i in range(chats):
        engine.add_request([(t + i) % 1000 + 300 for t in prompt], params)
    generated, t_decode = 0, None
    while engine.has_unfinished():
        outs = engine.step()
        generated += sum(len(o.new_token_ids) for o in outs)
        if t_decode is None and generated >= chats:  # every chat has its first token: decoding from here
            t_decode, generated = time.perf_counter(), 0
    return generated / (time.perf_counter() - t_decode)


def bench_model(path: str, prompt_tokens: int = 512, new_tokens: int = 64, chats: int = 64) -> list[dict]:
    from app.bench.lib.workloads import bench_ember, make_prompt

    out = []
    for weights in ("quantized", "dense"):
        engine = load_engine_on_cuda(path, weights, chats, prompt_tokens)
        prompt = make_prompt(engine.tokenizer.encode, prompt_tokens)
        bench_ember(engine, prompt[:32], 8)
        runs = [bench_ember(engine, prompt, new_tokens) for _ in range(3)]
        pp, tg = (sorted(r[i] for r in runs)[1] for i in (0, 1))
        many = bench_chats(engine, prompt[:128], chats, new_tokens)
        out.append({"weights": weights, "prefill_tok_s": pp, "decode_tok_s": tg, f"decode_{chats}_chats_tok_s": many,
                    "gpu_mem_gib": torch.cuda.max_memory_allocated() / 2**30})
        print(f"{weights:10s} prefill {pp:9.1f} tok/s   decode {tg:7.1f} tok/s   {chats} chats {many:8.1f} tok/s",
              flush=True)
        del engine
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return out


def profile_chats(path: str, chats: int = 64, steps: int = 20) -> str:
    """Where a decode step of `chats` chats spends its time: cProfile over engine.step (host side)
    and torch.profiler's CUDA kernel table, for the step's launch count and GPU time."""
    import cProfile
    import io
    import pstats

    from engine.sampling_params import SamplingParams

    engine = load_engine_on_cuda(path, "quantized", chats, 512)
    params = SamplingParams(temperature=0.0, max_tokens=steps + 40, ignore_eos=True)
    for i in range(chats):
        engine.add_request([300 + (i * 7 + j) % 1000 for j in range(128)], params)
    for _ in range(12):  # prefill and warm-up
        engine.step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(steps):
        engine.step()
    torch.cuda.synchronize()
    prof.disable()
    step_ms = (time.perf_counter() - t0) / steps * 1e3
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(30)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
        for _ in range(3):
            engine.step()
        torch.cuda.synchronize()
    table = tp.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    from engine.layers.int4_linear import DENSE_ROWS
    text = (f"{chats} chats: {step_ms:.1f} ms a decode step ({chats * 1e3 / step_ms:.0f} tok/s), "
            f"DENSE_ROWS {DENSE_ROWS}\n{out.getvalue()}\n{table}")
    print(text, flush=True)
    return text


def bench_hf(prompt_tokens: int = 512, new_tokens: int = 64, chats: int = 64) -> dict:
    """transformers' generate, bf16, random weights of Qwen2.5-1.5B's shapes: prefill, one stream, chats."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    c = QWEN_1_5B_MODEL
    cfg = Qwen2Config(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["ffn"],
                      num_hidden_layers=c["n_layers"], num_attention_heads=c["n_heads"],
                      num_key_value_heads=c["n_kv_heads"], rope_theta=c["rope_theta"], rms_norm_eps=c["rms_eps"],
                      tie_word_embeddings=True, max_position_embeddings=4096)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(300, 1300, (1, prompt_tokens), device="cuda")

    def gen(x, n):
        return model.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)

    with torch.inference_mode():
        gen(ids[:, :32], 4)
        prefill = gpu_time(lambda: model(ids), reps=5)
        whole = gpu_time(lambda: gen(ids, new_tokens), reps=3)
        batch = ids[:, :128].repeat(chats, 1)
        many = gpu_time(lambda: gen(batch, new_tokens), reps=2) - gpu_time(lambda: model(batch), reps=2)
    r = {"prefill_tok_s": prompt_tokens / prefill, "decode_tok_s": (new_tokens - 1) / (whole - prefill),
         f"decode_{chats}_chats_tok_s": chats * (new_tokens - 1) / many}
    print(f"transformers bf16: prefill {r['prefill_tok_s']:9.1f} tok/s   decode {r['decode_tok_s']:7.1f} tok/s   "
          f"{chats} chats {r[f'decode_{chats}_chats_tok_s']:8.1f} tok/s", flush=True)
    del model
    torch.cuda.empty_cache()
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a GGUF file for the end-to-end figures")
    ap.add_argument("--qwen-shapes", action="store_true", help="write and use a random Q4_K Qwen2.5-1.5B-shaped GGUF")
    ap.add_argument("--hf", action="store_true", help="transformers' generate on the same shapes, side by side")
    ap.add_argument("--profile", action="store_true", help="only profile 64 chats' decode steps (host and CUDA)")
    ap.add_argument("--layers-only", action="store_true", help="only the layer timings (where DENSE_ROWS belongs)")
    ap.add_argument("--dense-rows", type=int, help="Int4Linear's DENSE_ROWS for this run")
    ap.add_argument("--out", default=".", help="where cuda_check.json goes")
    args = ap.parse_args()
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)):
        print("no sm80+ CUDA GPU here: nothing to check")
        return 2
    sys.path.insert(0, str(ROOT))
    if args.dense_rows is not None:
        from engine.layers import int4_linear
        int4_linear.DENSE_ROWS = args.dense_rows
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    print(f"{report['device']}, torch {report['torch']}", flush=True)
    t0 = time.perf_counter()
    if args.profile:
        model = write_qwen_shapes(Path(tempfile.gettempdir()) / "qwen2.5-1.5b-shapes-q4_k.gguf")
        Path(args.out, "profile.txt").write_text(profile_chats(model))
        return 0
    if args.layers_only:
        report["layers"] = bench_layers([1, 8, 32, 64, 128, 256, 512])
        Path(args.out, "cuda_check.json").write_text(json.dumps(report, indent=2))
        return 0
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                            str(ROOT / "tests" / "kernels" / "test_int4_linear.py")], cwd=ROOT)
    report["tests_rc"] = tests.returncode
    report["copy_gb_s"] = copy_bandwidth() / 1e9
    print(f"copy bandwidth {report['copy_gb_s']:.0f} GB/s (read + write)", flush=True)
    report["layers"] = bench_layers([1, 8, 32, 64, 128, 256, 512])
    scratch = Path(tempfile.gettempdir()) / "qwen2.5-1.5b-shapes-q4_k.gguf"
    model = write_qwen_shapes(scratch) if args.qwen_shapes else args.model
    if model:
        report["model"] = {"path": model, "bytes": Path(model).stat().st_size, "runs": bench_model(model)}
        # one decode step reads every weight once (the file's bytes, less the embedding rows it skips)
        roof = report["copy_gb_s"] * 1e9 / report["model"]["bytes"]
        report["model"]["roofline_decode_tok_s"] = roof
        print(f"roofline: {roof:.0f} tok/s for one stream at the copy bandwidth", flush=True)
    if args.hf:
        report["transformers_bf16"] = bench_hf()
    report["seconds"] = time.perf_counter() - t0
    Path(args.out, "cuda_check.json").write_text(json.dumps(report, indent=2))
    return tests.returncode


if __name__ == "__main__":
    raise SystemExit(main())
