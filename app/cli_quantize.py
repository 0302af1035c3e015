"""`ember quantize SRC OUT`: RTN, GPTQ or AWQ into a GPTQ/AWQ/compressed-tensors checkpoint.

The work is engine/quant/pipeline.py; this is the terminal around it: a progress bar over the
layers with the time left, and Ctrl-C that stops cleanly with nothing written at OUT.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quantize", help="quantize a model to 4 or 8 bits (RTN, GPTQ, AWQ) into a GPTQ/AWQ "
                                        "checkpoint directory",
                       description="SRC is a GGUF file or a float safetensors directory; OUT a new folder. "
                                   "Calibration (GPTQ, AWQ) defaults to text from Python's standard library "
                                   "mixed with replies the model writes itself.")
    p.add_argument("src", type=Path, metavar="SRC")
    p.add_argument("out", type=Path, metavar="OUT")
    p.add_argument("--method", choices=("rtn", "gptq", "awq"), default="gptq")
    p.add_argument("--bits", type=int, choices=(4, 8), default=4)
    p.add_argument("--group-size", type=int, choices=(32, 64, 128, -1), default=128,
                   help="input values per scale; -1: one scale per output channel")
    p.add_argument("--desc-act", action="store_true", help="GPTQ act-order: quantize columns by decreasing "
                                                           "activation (groups become non-contiguous)")
    p.add_argument("--static-groups", action="store_true", help="with --desc-act: each group's scale from the "
                   "columns in file order, so the checkpoint needs no permutation at run time")
    sym = p.add_mutually_exclusive_group()
    sym.add_argument("--sym", dest="sym", action="store_true", default=None, help="symmetric (zero point 2^(b-1)); "
                                                                                    "GPTQ's default")
    sym.add_argument("--asym", dest="sym", action="store_false", help="a zero point per group; AWQ's default")
    p.add_argument("--calibration", type=Path, metavar="FILE", help="a UTF-8 text file to calibrate on")
    p.add_argument("--no-self-calibration", dest="self_calibration", action="store_false",
                   help="without --calibration: the standard library's text only, none of the model's own replies")
    p.add_argument("--format", choices=("gptq", "gptq_v2", "awq", "compressed-tensors"), default=None,
                   help="checkpoint layout (default: awq for --method awq, else gptq)")
    p.add_argument("--samples", type=int, default=32, help="calibration samples")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per calibration sample")
    p.add_argument("--damp", type=float, default=None,
                   help="GPTQ's dampening, a fraction of the Hessian's mean diagonal (damp_percent; "
                        "default: QuantizeConfig.damp in engine/quant/pipeline.py)")
    p.add_argument("--mse-scales", action="store_true",
                   help="GPTQ: each group's range from a clip search (quant.py's mse) rather than its min and max; "
                        "helped SmolLM2-135M, not Qwen2.5-Coder-0.5B at g128 on held-out text")
    p.add_argument("--awq-clip", action="store_true", help="AWQ: also search a clip ratio per group (AutoAWQ's "
                   "apply_clip; helped SmolLM2-135M, hurt Qwen2.5-Coder-0.5B on held-out text)")
    p.add_argument("--threads", "-t", type=int, default=None)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_quantize)


def config_from_args(args):
    from engine.model_files.quant_config import CheckpointFormat
    from engine.quant.quantize_config import Method, QuantizeConfig

    method = Method(args.method)
    fmt = CheckpointFormat(args.format or ("awq" if method is Method.AWQ else "gptq"))
    sym = args.sym if args.sym is not None else method is not Method.AWQ and fmt is not CheckpointFormat.AWQ
    return QuantizeConfig(method=method, bits=args.bits, group_size=args.group_size, sym=sym,
                          desc_act=args.desc_act, static_groups=args.static_groups, format=fmt, calibration=args.calibration,
                          self_calibration=args.self_calibration,
                          num_samples=args.samples, seq_len=args.seq_len, awq_clip=args.awq_clip,
                          mse_scales=args.mse_scales,
                          **({} if args.damp is None else {"damp": args.damp}))


def cmd_quantize(args) -> int:
    import torch
    from tqdm import tqdm

    from engine.quant.pipeline import quantize_model
    from engine.quant.source import open_source
    from engine.quant.writer import CheckpointWriter

    try:
        cfg = config_from_args(args)
        cfg.check()
        if args.calibration is not None and not args.calibration.is_file():
            raise ValueError(f"--calibration {args.calibration}: no such file")
        if args.threads:
            torch.set_num_threads(args.threads)
        src = open_source(args.src)
        writer = CheckpointWriter(args.out, src, cfg.spec)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"ember quantize: {e}", file=sys.stderr)
        return 2
    bar = tqdm(total=src.config.num_layers, unit="layer", disable=args.no_progress, file=sys.stderr)

    def progress(done: int, total: int, what: str) -> None:
        bar.n = done
        bar.set_description(what, refresh=False)
        bar.refresh()

    try:
        report = quantize_model(src, cfg, writer.add_layer, progress)
        bar.set_description("writing")
        out = writer.finish()
    except KeyboardInterrupt:
        writer.abort()
        bar.close()
        print(f"\nember quantize: stopped (Ctrl-C); nothing was written to {args.out}", file=sys.stderr)
        return 130
    except (ValueError, OSError) as e:
        writer.abort()
        bar.close()
        print(f"ember quantize: {e}", file=sys.stderr)
        return 1
    finally:
        src.close()
    bar.close()
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    worst = max(report.output_error, default=0.0)
    print(f"{out}: {cfg.method} {cfg.bits}-bit g{cfg.group_size} {'sym' if cfg.sym else 'asym'}"
          f"{' act-order' if cfg.desc_act else ''}, {cfg.format} format, {size:.1f} MiB, "
          f"{report.seconds:.0f} s" + (f", {report.calibration_tokens} calibration tokens, worst layer "
                                        f"output error {worst:.2%}" if report.calibration_tokens else ""))
    if report.heldout is not None:  # GPTQ: the checkpoint against RTN on calibration rows no Hessian saw
        h = report.heldout
        ours, theirs = (h.chosen / h.reference) ** 0.5, (h.rtn / h.reference) ** 0.5  # relative norms, as above
        print(f"held-out output error {ours:.3%} (RTN's {theirs:.3%}); "
              f"rows from GPTQ {h.rows_gptq}, from RTN {h.rows_rtn}")
    return 0
