"""A GPTQ checkpoint made by `ember quantize` from the bundled model, served by a real `ember serve`
process and asked through the official `openai` client; its greedy reply is the in-process
engine's on the same checkpoint, token for token (same kernels, same bits)."""
from __future__ import annotations

import inspect
import json
import textwrap

import pytest
import torch
from server_util import openai_client, start_engine

from app.cli import main
from engine.backends import load_engine
from engine.config import EngineConfig
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

MSGS = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def gptq_dir(bundled_model_path, tmp_path_factory):
    # calibrated on a text file: serving is the claim here, and the model's own replies (the
    # default) would take an engine of their own to write (test_quantize_quality's GPTQ has them)
    out = tmp_path_factory.mktemp("quant") / "smollm2-gptq"
    calibration = out.with_name("calibration.txt")
    calibration.write_text(inspect.getsource(textwrap), encoding="utf-8")
    assert main(["quantize", str(bundled_model_path), str(out), "--method", "gptq", "--samples", "4",
                 "--seq-len", "128", "--calibration", str(calibration), "--threads", "1", "--no-progress"]) == 0
    return out


def test_a_quantized_checkpoint_is_served_and_answers_the_openai_client(gptq_dir, tmp_path):
    q = json.loads((gptq_dir / "config.json").read_text())["quantization_config"]
    assert (q["quant_method"], q["bits"], q["group_size"]) == ("gptq", 4, 128)
    proc = start_engine(gptq_dir, tmp_path, "--dtype", "float32")
    try:
        client = openai_client(proc)
        model = proc.health()["model"]
        assert model in [m.id for m in client.models.list().data]
        r = client.chat.completions.create(model=model, messages=MSGS, max_tokens=16, temperature=0)
        c = r.choices[0]
        assert c.message.content.strip() and c.finish_reason in ("stop", "length")
        assert r.usage.completion_tokens <= 16 and r.usage.prompt_tokens > 5
        streamed = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
            model=model, messages=MSGS, max_tokens=16, temperature=0, stream=True) if ch.choices)
        assert streamed == c.message.content
        served = client.completions.create(model=model, prompt="The three primary colours are", max_tokens=12,
                                           temperature=0).choices[0].text
    finally:
        proc.stop()

    torch.set_num_threads(1)
    engine, decision = load_engine(EngineConfig(model_path=str(gptq_dir), dtype="float32", num_threads=1,
                                                num_kv_blocks=64), "torch", "cpu")
    try:
        assert decision.backend == "torch" and engine.runner.quantized
        assert engine.runner.model.stack is not None  # every matrix on the kernels, as for a GGUF
        local = engine.generate(["The three primary colours are"], SamplingParams(temperature=0, max_tokens=12))
        assert local[0].text == served
    finally:
        engine.close()
