"""The model's recommended sampling, read from the model itself (GGUF general.sampling.*, or a
GPTQ/AWQ folder's generation_config.json), and the order in which a chat's settings win."""
from __future__ import annotations

import json

from app.sampling_defaults import APP_DEFAULTS, effective_settings, model_sampling_defaults, request_fields
from store_helpers import write_tiny_gguf


def test_gguf_keys_and_generation_config(tmp_path):
    gguf = write_tiny_gguf(tmp_path / "m.gguf", floats={"general.sampling.temp": 0.6, "general.sampling.top_p": 0.9})
    assert model_sampling_defaults(gguf) == {"temperature": 0.6, "top_p": 0.9}
    assert model_sampling_defaults(write_tiny_gguf(tmp_path / "plain.gguf")) == {}
    folder = tmp_path / "gptq"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.2, "top_p": 7, "do_sample": True}))
    assert model_sampling_defaults(folder) == {"temperature": 0.2}, "a value out of bounds is not a recommendation"
    assert model_sampling_defaults(tmp_path / "missing.gguf") == {} and model_sampling_defaults(None) == {}
    (tmp_path / "bad.gguf").write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    assert model_sampling_defaults(tmp_path / "bad.gguf") == {}


def test_the_chats_own_values_win_then_the_models_then_embers():
    model = {"temperature": 0.3}
    assert effective_settings({}, None) == APP_DEFAULTS
    assert effective_settings({}, model)["temperature"] == 0.3
    assert effective_settings({"temperature": 1.0, "top_p": None}, model) == {**APP_DEFAULTS, "temperature": 1.0}
    system, sampling = request_fields(effective_settings({"system_prompt": "  "}, model))
    assert system is None and sampling == {"temperature": 0.3, "top_p": 0.95, "max_tokens": 512,
                                           "max_tokens_fit": True}  # a cap: never refused near the end
