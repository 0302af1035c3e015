"""Self-calibration: the model's own replies, written by Ember's engine on the bundled model, are
the same text on every run (seeded), follow the chat template, and make half of the default
calibration text; a file or --no-self-calibration leaves them out."""
from __future__ import annotations

from engine.loaders.chat_template import ChatTemplate
from engine.quant.calibration import default_calibration_text
from engine.quant.pipeline import calibration_text
from engine.quant.quantize_config import Method, QuantizeConfig
from engine.quant.self_calibration import REQUESTS, interleave, self_generated_text
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
