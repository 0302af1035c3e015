"""`ember bench quant`: what RTN, GPTQ and AWQ cost and buy, on one model, in one run.

For the reference weights (the GGUF file itself) and each (method, group) asked for, `ember
quantize`'s pipeline writes a checkpoint (kept under --work, reused when its settings match),
then the table shows:
  perplexity  on a fixed text (default: tests/data/corpus, never the calibration text), with the
              weights dequantized to float32, so only the weights' rounding differs between rows;
  size        on disk (the GGUF file; the checkpoint directory);
  decode      tok/s of one stream on Ember's kernels (the engine as `ember serve` runs it).
A GGUF source's "reference" is already quantized (the bundled model is Q4_1 with a Q8_0
table): the rows measure re-quantizing those values, so the figures are the cost on top of
the file's own rounding, and a method can at best tie the reference.
"""
from __future__ import annotations

import json
from pathlib import Path

from app.bench import add_model_args

CORPUS = Path(__file__).resolve().parents[2] / "tests" / "data" / "corpus"
# what a kept checkpoint's self-calibration was made with: older ones (replies on the quantized
# kernels, noise by rank) differ between machines and are made again
CALIBRATION = "stdlib+self (float32 replies, noise by token id)"
GPTQ_ARITHMETIC = "float64, exact sums, own Cholesky, held-out rows RTN's where it errs less"


def eval_text(paths: list[Path] | None) -> str:
    files = paths or sorted(p for p in CORPUS.glob("*.txt"))
    if not files:
        raise SystemExit(f"no evaluation text: pass --text FILE (the default {CORPUS} is missing)")
    return "\n\n".join(p.read_text(encoding="utf-8") for p in files)


def checkpoint(src: Path, work: Path, cfg) -> tuple[Path, float]:
    """The checkpoint for `cfg` under `work` (made now, or reused): (path, seconds it took)."""
    from engine.quant.pipeline import quantize_model
    from engine.quant.source import open_source
    from engine.quant.writer import CheckpointWriter

    key = (f"{cfg.method}-b{cfg.bits}-g{cfg.group_size}-{'sym' if cfg.sym else 'asym'}"
           f"{'-act' if cfg.desc_act else ''}{'-static' if cfg.static_groups else ''}{'-clip' if cfg.awq_clip else ''}{'-mse' if cfg.mse_scales else ''}"
           f"-{cfg.format}")
    out = work / key
    stamp = out / "ember-bench.json"
    want = {"src": str(src), "size": src.stat().st_size, "samples": cfg.num_samples, "seq_len": cfg.seq_len,
            "calibration": CALIBRATION if cfg.self_calibration else "stdlib", "damp": cfg.damp}
    if cfg.method == "gptq":  # checkpoints of the float32 GPTQ (before issue 69) are made again
        want["gptq"] = GPTQ_ARITHMETIC
    if stamp.is_file() and json.loads(stamp.read_text()).get("want") == want:
        return out, json.loads(stamp.read_text())["seconds"]
    if out.exists():
        import shutil

        shutil.rmtree(out)
    s = open_source(src)
    try:
        writer = CheckpointWriter(out, s, cfg.spec)
        report = quantize_model(s, cfg, writer.add_layer)
        writer.finish()
    finally:
        s.close()
    stamp.write_text(json.dumps({"want": want, "seconds": report.seconds}))
    return out, report.seconds


def measure(path: Path, texts: dict[str, list[int]], cache: Path, threads: int, new_tokens: int,
            runs: int) -> tuple[dict[str, float], float]:
    """({text: perplexity with float32 weights}, median decode tok/s on the kernels). The
    perplexities are deterministic, so they are kept beside the checkpoint and reused."""
    import hashlib
    import statistics

    import torch

    from app.bench.lib.workloads import bench_ember, make_prompt
    from engine.backends import load_engine
    from engine.config import EngineConfig
    from engine.loaders.load import load_model
    from engine.quant.perplexity import perplexity

    torch.set_num_threads(threads)
    key = hashlib.sha256(json.dumps(texts).encode()).hexdigest()[:16]
    known = json.loads(cache.read_text()) if cache.is_file() else {}
    if known.get("key") != key:
        model = load_model(path, torch.float32, "cpu", quantized=False)
        known = {"key": key, "ppl": {name: perplexity(model, ids)[0] for name, ids in texts.items()}}
        del model
        cache.write_text(json.dumps(known))
    ppl = known["ppl"]
    engine, _ = load_engine(EngineConfig(model_path=str(path), num_threads=threads, enable_prefix_caching=False),
                            "torch", "cpu")
    prompt = make_prompt(engine.tokenizer.encode, 32)
    bench_ember(engine, prompt, 8)
    tg = statistics.median(bench_ember(engine, prompt, new_tokens)[1] for _ in range(runs))
    engine.close()
    return ppl, tg


def size_of(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.iterdir()
                                                          if not f.name.startswith("ember-bench"))


VARIANTS = {  # name -> (method, symmetric, desc_act + static_groups or AWQ's clip); AWQ's format is
    # asymmetric, so its fair baseline is rtn-asym
    "rtn": ("rtn", True, False), "rtn-asym": ("rtn", False, False), "gptq": ("gptq", True, False),
    "gptq-act": ("gptq", True, True), "gptq-mse": ("gptq", True, "mse"), "awq": ("awq", False, False), "awq-clip": ("awq", False, True)}


def variant_config(name: str, group: int, args):
    from engine.model_files.quant_config import CheckpointFormat
    from engine.quant.quantize_config import Method, QuantizeConfig

    method, sym, extra = VARIANTS[name]
    m = Method(method)
    act = extra is True and m is Method.GPTQ
    return QuantizeConfig(method=m, bits=4, group_size=group, sym=sym, desc_act=act, static_groups=act,
                          awq_clip=extra and m is Method.AWQ, mse_scales=extra == "mse",
                          format=CheckpointFormat.AWQ if m is Method.AWQ else CheckpointFormat.GPTQ,
                          num_samples=args.samples, seq_len=args.seq_len, damp=args.damp)


def run(args) -> int:
    from engine.loaders.tokenizer import Tokenizer
    from engine.model_files.bundled import default_model_path
    from engine.quant.calibration import doc_topics

    src = Path(args.model or default_model_path())
    work = Path(args.work).expanduser() / src.stem
    work.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(src)
    texts = {"docs": tok.encode(doc_topics(1), add_bos=False, parse_special=False)[:args.eval_tokens],
             "corpus": tok.encode(eval_text(args.text), add_bos=False, parse_special=False)[:args.eval_tokens]}
    tok.close()
    print(f"model {src}\nthreads {args.threads}; perplexity with float32 weights (windows of 512, second halves "
          f"scored) on 'docs' ({len(texts['docs'])} tokens: the held-out half of Python's documentation topics, "
          f"the calibration's kind of text) and 'corpus' ({len(texts['corpus'])} tokens: tests/data/corpus, prose "
          f"in seven languages, code, emoji); decode: {args.new_tokens} tokens after a 32-token prompt, median of "
          f"{args.runs}, Ember's kernels; calibration {args.samples} x {args.seq_len} tokens of the standard "
          f"library's text interleaved with the model's own replies", flush=True)
    rows = [("reference (the GGUF)", src, 0.0)]
    for name in args.variants.split(","):
        for g in (int(x) for x in args.groups.split(",")):
            path, secs = checkpoint(src, work, variant_config(name, g, args))
            print(f"  {name} g{g}: {path} ({secs:.0f} s to quantize)", flush=True)
            rows.append((f"{name} int4 g{g}", path, secs))
    print(f"\n{'weights':<20}{'ppl docs':>9}{'vs ref':>8}{'ppl corpus':>11}{'vs ref':>8}{'size MiB':>9}"
          f"{'decode tok/s':>13}{'quantize s':>11}")
    ref = None
    for name, path, secs in rows:
        cache = path / "ember-bench-ppl.json" if path.is_dir() else work / "reference-ppl.json"
        ppl, tg = measure(path, texts, cache, args.threads, args.new_tokens, args.runs)
        ref = ref or ppl
        print(f"{name:<20}{ppl['docs']:>9.3f}{ppl['docs'] / ref['docs'] - 1:>+8.1%}{ppl['corpus']:>11.3f}"
              f"{ppl['corpus'] / ref['corpus'] - 1:>+8.1%}{size_of(path) / 2**20:>9.1f}{tg:>13.1f}{secs:>11.0f}",
              flush=True)
    return 0


def register(bench_sub) -> None:
    from engine.quant.quantize_config import QuantizeConfig

    p = bench_sub.add_parser("quant", help="perplexity, size and decode speed of RTN, GPTQ and AWQ int4")
    add_model_args(p, no_images="it measures the quantized LM's text (perplexity, size, decode speed)")
    p.add_argument("--variants", default="rtn,rtn-asym,gptq,gptq-act,awq,awq-clip",
                   help="rtn (symmetric), rtn-asym, gptq, gptq-mse (ranges from a clip search), gptq-act "
                        "(act-order with static groups), awq, "
                        "awq-clip (with AutoAWQ's clip search)")
    p.add_argument("--groups", default="128,32")
    p.add_argument("--samples", type=int, default=32, help="calibration samples")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per calibration sample")
    p.add_argument("--damp", type=float, default=QuantizeConfig.damp,
                   help="GPTQ's dampening, a fraction of mean(diag H)")
    p.add_argument("--text", type=Path, nargs="*", help="the 'corpus' text files (default: tests/data/corpus)")
    p.add_argument("--eval-tokens", type=int, default=4096, help="tokens of each text to score")
    p.add_argument("--work", default="~/.cache/ember/bench-quant", help="where the checkpoints are kept")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.set_defaults(func=run)
