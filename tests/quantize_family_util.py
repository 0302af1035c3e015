"""Shared steps of the per-family `ember quantize` tests (tests/engine/test_quantize_gemma3.py,
test_quantize_phi3.py): a tiny family GGUF through the real CLI at 8 bits, and the check that
the checkpoint Ember loads back is the file's model."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from app.cli import main
from arch_ggufs import vocab_size
from engine.kernels import kernels
from engine.loaders.gguf_loader import load_model
from engine.loaders.load import load_model as load_any
from model_oracles import our_logits

T = 70  # tokens per sample and per check: past the tiny Gemma's 32-token window


def quantize(gguf: Path, out: Path, method: str, *extra: str) -> None:
    """8-bit, groups of 32, two samples of the text written beside the GGUF."""
    assert main(["quantize", str(gguf), str(out), "--method", method, "--format", "gptq", "--bits", "8",
                 "--group-size", "32", "--samples", "2", "--seq-len", str(T),
                 "--calibration", str(gguf.parent / "calibration.txt"), "--no-progress", *extra]) == 0


def tokens() -> list[int]:
    return np.random.default_rng(5).integers(0, vocab_size(), size=T).tolist()


def max_rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def assert_runs_as_the_file(gguf: Path, out: Path) -> None:
    """The checkpoint's config is the file's, and its logits are the file's within 8-bit rounding
    (float16 norms): dense, and on the kernels where this CPU has them."""
    import torch

    model = load_model(gguf)
    want = our_logits(model, tokens())
    dense = load_any(out, torch.float32, "cpu")
    assert dense.config == model.config
    assert max_rel(our_logits(dense, tokens()), want) < 3e-2
    if kernels() is not None:
        quantized = load_any(out, torch.float32, "cpu", quantized=True)
        assert max_rel(our_logits(quantized, tokens()), want) < 6e-2
