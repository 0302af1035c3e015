"""Self-calibration: the model's own replies, written by Ember's engine on the bundled model, are
the same text on every run (seeded), follow the chat template, and make half of the default
calibration text; a file or --no-self-calibration leaves them out."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from engine.kernels import available_paths
from engine.loaders.chat_template import ChatTemplate
from engine.quant.calibration import default_calibration_text
from engine.quant.pipeline import calibration_text
from engine.quant.quantize_config import Method, QuantizeConfig
from engine.quant.self_calibration import REQUESTS, float32_bytes, interleave, self_generated_text
from engine.quant.source import open_source


def test_the_models_own_replies_are_seeded_and_follow_its_chat_template(bundled_model_path):
    first = self_generated_text(bundled_model_path, 3, max_tokens=24)
    assert first == self_generated_text(bundled_model_path, 3, max_tokens=24)
    template = ChatTemplate.from_model(bundled_model_path)
    turns = first.split("\n\n")
    at = 0
    for request in REQUESTS[:3]:
        prompt = template.render([{"role": "user", "content": request}], add_generation_prompt=True)
        at = first.index(prompt, at) + len(prompt)
        reply = first[at:].split("<|im_start|>", 1)[0]
        assert reply.strip(), f"no reply after {request!r}: {turns}"
    assert self_generated_text(bundled_model_path, 3, max_tokens=24, seed=1) != first


def test_interleave_alternates_pieces_and_keeps_every_character():
    assert interleave("aaaaa", "bb", step=2) == "aabbaaa"
    assert interleave("", "xyz", step=2) == "xyz"
    a, b = "".join(map(str, range(300))), "abc" * 77
    mixed = interleave(a, b, step=16)
    assert sorted(mixed) == sorted(a + b)


def test_default_calibration_mixes_the_models_replies_into_the_standard_librarys_text(bundled_model_path, tmp_path):
    src = open_source(bundled_model_path)
    try:
        mixed = calibration_text(src, QuantizeConfig(method=Method.GPTQ, num_samples=2, seq_len=32))
        plain = calibration_text(src, QuantizeConfig(method=Method.GPTQ, self_calibration=False))
        file = tmp_path / "calibration.txt"
        file.write_text("only this text", encoding="utf-8")
        own = calibration_text(src, QuantizeConfig(method=Method.GPTQ, calibration=file))
    finally:
        src.close()
    stdlib = default_calibration_text()
    assert plain == stdlib and own == "only this text"
    assert REQUESTS[0] in mixed and len(mixed) > len(stdlib)
    assert mixed[:2048] != stdlib[:2048] and stdlib[:2048] in mixed


WRITE = ("import sys; from engine.quant.self_calibration import self_generated_text; "
         "sys.stdout.write(self_generated_text(sys.argv[1], 8, max_tokens=96))")


def test_the_models_replies_are_the_same_text_on_every_cpu_path_and_under_torchs_plain_kernels(
        bundled_model_path, monkeypatch):
    """The calibration text does not depend on where `ember quantize` runs (issue 44): the same
    on each of Ember's kernel paths this CPU runs, and with torch's vectorized kernels turned off
    (ATEN_CPU_CAPABILITY=default, another rounding of the same float32 maths, as another
    machine's CPU gives), which every machine can run."""
    texts = {}
    for path in available_paths():
        monkeypatch.setenv("EMBER_CPU_PATH", path.name.lower())
        texts[path.name] = self_generated_text(bundled_model_path, 8, max_tokens=96)
    monkeypatch.delenv("EMBER_CPU_PATH")
    env = os.environ | {"ATEN_CPU_CAPABILITY": "default"}
    texts["torch default"] = subprocess.run([sys.executable, "-c", WRITE, str(bundled_model_path)], env=env,
                                            cwd=Path(__file__).parents[2], capture_output=True, text=True,
                                            check=True, timeout=600).stdout
    first = next(iter(texts.values()))
    assert len(first) > 2000 and REQUESTS[7] in first
    assert all(t == first for t in texts.values()), {k: len(t) for k, t in texts.items()}


def test_float32_bytes_counts_four_bytes_a_parameter(bundled_model_path):
    from engine.model_files.meta import read_gguf_meta

    assert float32_bytes(Path(bundled_model_path)) == 4 * read_gguf_meta(bundled_model_path).parameter_count > 4 * 10**8


def test_float32_bytes_of_a_safetensors_folder(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(3, 5, dtype=torch.bfloat16), "b": torch.zeros(7)}, str(tmp_path / "m-1.safetensors"))
    save_file({"c": torch.zeros(2, 2, 2, dtype=torch.float16)}, str(tmp_path / "m-2.safetensors"))
    assert float32_bytes(tmp_path) == 4 * (15 + 7 + 8)
