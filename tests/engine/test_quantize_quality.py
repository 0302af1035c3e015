"""GPTQ and AWQ earn their calibration: on the bundled model, 4-bit g128 checkpoints made by
`ember quantize`'s pipeline have lower perplexity than round-to-nearest on held-out text of the
calibration's kind (the other half of Python's documentation topics), with weights dequantized
to float32 so only the rounding differs. The margins seen here are wide (RTN 19.1, GPTQ 15.8,
AWQ 13.3 on 2,048 tokens with 8 x 128 calibration tokens); a broken Hessian, scale fold or
error feedback lands at or above RTN. `ember bench quant` measures the full table."""
from __future__ import annotations

import pytest
import torch

from engine.loaders.load import load_model
from engine.loaders.tokenizer import load_tokenizer
from engine.quant.calibration import doc_topics
from engine.model_files.quant_config import CheckpointFormat
from engine.quant.perplexity import perplexity
from engine.quant.pipeline import quantize_model
from engine.quant.quantize_config import Method, QuantizeConfig
from engine.quant.source import open_source
from engine.quant.writer import CheckpointWriter

pytestmark = pytest.mark.slow


def quantized_perplexity(src_path, out, method: Method, ids: list[int]) -> float:
    cfg = QuantizeConfig(method=method, sym=method is not Method.AWQ, num_samples=8, seq_len=128,
                         format=CheckpointFormat.AWQ if method is Method.AWQ else CheckpointFormat.GPTQ)
    src = open_source(src_path)
    try:
        writer = CheckpointWriter(out, src, cfg.spec)
        quantize_model(src, cfg, writer.add_layer)
        writer.finish()
    finally:
        src.close()
    return perplexity(load_model(out, torch.float32, "cpu", quantized=False), ids)[0]


def test_gptq_and_awq_beat_round_to_nearest(bundled_model_path, tmp_path):
    torch.set_num_threads(2)
    tok = load_tokenizer(bundled_model_path)
    ids = tok.encode(doc_topics(1), add_bos=False, parse_special=False)[:2048]
    tok.close()
    reference = perplexity(load_model(bundled_model_path, torch.float32, "cpu"), ids)[0]
    ppl = {m: quantized_perplexity(bundled_model_path, tmp_path / str(m), m, ids) for m in Method}
    assert reference < ppl[Method.AWQ] and reference < ppl[Method.GPTQ]  # re-rounding never helps
    assert ppl[Method.GPTQ] < 0.95 * ppl[Method.RTN], ppl
    assert ppl[Method.AWQ] < 0.95 * ppl[Method.RTN], ppl
