"""Llama 3.x RoPE scaling through `ember quantize` (issue 38): the GGUF's rope_freqs tensor read
back as Hugging Face's llama3 rope_scaling numbers (engine/layers/llama3_rope.py), which the
Hugging Face loader turns into the same divisors; a rope_freqs no llama3 numbers make is refused
before anything is quantized."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from app.cli import main
from engine.layers.llama3_rope import llama3_factors, llama3_params
from engine.loaders.gguf_loader import load_model
from engine.loaders.load import load_model as load_any
from engine.quant.source import open_source
from model_oracles import our_logits

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def converter_factors(d, base, factor, lo, hi, L) -> torch.Tensor:
    """convert_hf_to_gguf.py's LlamaModel rope_freqs, in its float32 steps (the reference)."""
    freqs = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < L / hi:
            out.append(1)
        elif wavelen > L / lo:
            out.append(factor)
        else:
            smooth = (L / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


@pytest.mark.parametrize("case,want", [
    ((128, 500000.0, 8.0, 1.0, 4.0, 8192), (1.0, 4.0)),  # Llama 3.1 8B
    ((64, 500000.0, 32.0, 1.0, 4.0, 8192), (1.0, 4.0)),  # Llama 3.2 1B
    ((128, 500000.0, 8.0, 1.0, 4.0, 32768), (0.25, 1.0)),  # another original context: the same ratios at 8192
    ((16, 500000.0, 8.0, 1.0, 32.0, 8192), (1.0, 32.0)),
    ((16, 500000.0, 8.0, 1.0, 4.0, 8192), None),  # one smoothed pair: other edges, the same tensor
])
def test_the_numbers_come_back_and_remake_the_tensor(case, want):
    d, base, factor = case[:3]
    r = converter_factors(*case)
    p = llama3_params(r, d, base)
    assert p["factor"] == factor and p["original_max_position_embeddings"] == 8192
    if want is not None:
        assert (p["low_freq_factor"], p["high_freq_factor"]) == want
    torch.testing.assert_close(llama3_factors(d, base, **p), r, rtol=2.5e-7, atol=0)


def test_divisors_no_llama3_numbers_make_are_refused_in_words(tiny_model_factory):
    path = tiny_model_factory(arch="llama", rope_freqs=True, rope_theta=500000.0, seed=11)  # uniform random
    with pytest.raises(ValueError, match="rope_freqs .*llama3"):
        open_source(path)


def test_a_llama3_gguf_quantizes_to_a_checkpoint_ember_runs_as_the_file(tiny_model_factory, tmp_path):
    r = converter_factors(16, 500000.0, 8.0, 1.0, 32.0, 8192)
    src = tiny_model_factory(arch="llama", rope_freqs=tuple(r.tolist()), rope_theta=500000.0, seed=11)
    out = tmp_path / "out"
    calibration = tmp_path / "calibration.txt"
    calibration.write_text("hello there, the one and the other, " * 60)
    assert main(["quantize", str(src), str(out), "--method", "gptq", "--format", "gptq", "--bits", "8",
                 "--group-size", "32", "--samples", "2", "--seq-len", "64", "--calibration", str(calibration),
                 "--no-progress"]) == 0
    rs = json.loads((out / "config.json").read_text())["rope_scaling"]
    assert rs == {"rope_type": "llama3", "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 32.0, "original_max_position_embeddings": 8192}
    model, dense = load_model(src), load_any(out, torch.float32, "cpu")
    assert dense.config == model.config and dense.config.rope_freq_factors
    torch.testing.assert_close(dense.rotary.inv_freq, model.rotary.inv_freq, rtol=2.5e-7, atol=0)
    tokens = np.random.default_rng(5).integers(0, model.config.vocab_size, size=64).tolist()
    want = our_logits(model, tokens)
    err = float((our_logits(dense, tokens) - want).abs().max() / want.abs().max())
    assert err < 3e-2, err  # 8-bit weights (float16 norms)
