"""The `speculative` setting: its values, the file and env round trip, and the `--speculative` flag it
becomes through `engine_args` (an installed model's id resolved to its file, as the app resolves ids)."""
from __future__ import annotations

import json

import pytest

from app.cli import build_parser as ember_parser
from app.cli_serve import serve_args
from app.engine_process import engine_args
from app.settings import Settings
from app.store import ModelStore
from app.supervisor import EngineSupervisor


def flag_value(cmd: list[str], flag: str = "--speculative") -> str:
    return cmd[cmd.index(flag) + 1]


def test_fresh_settings_leave_the_engine_without_speculation(tmp_path):
    s = Settings(data_dir=tmp_path)
    assert s.speculative == "off" and engine_args(s)["speculative"] == "off"


@pytest.mark.parametrize("value,stored", [("off", "off"), ("ngram", "ngram"), ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b"),
                                          ("draft:qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b"),
                                          ("~/models/Draft.Q4_K.gguf", "~/models/Draft.Q4_K.gguf")])
def test_values_round_trip_through_the_file(tmp_path, value, stored):
    s = Settings.load(tmp_path / "settings.json")
    s.speculative = value
    s.save()
    assert json.loads((tmp_path / "settings.json").read_text())["speculative"] == stored
    assert Settings.load(tmp_path / "settings.json").speculative == stored


@pytest.mark.parametrize("value", ["", "draft:", "Not An Id", "/models/draft.bin", "ngram please"])
def test_bad_values_are_refused(tmp_path, value):
    with pytest.raises(ValueError, match="speculative"):
        Settings(data_dir=tmp_path, speculative=value)


def test_env_var_sets_it_without_writing_it_to_the_file(tmp_path):
    s = Settings.load(tmp_path / "settings.json", env={"EMBER_SPECULATIVE": "ngram"})
    assert s.speculative == "ngram" and engine_args(s)["speculative"] == "ngram"
    s.save()
    assert "speculative" not in json.loads((tmp_path / "settings.json").read_text())


def test_a_draft_model_id_becomes_its_file_and_a_path_stays_a_path(tmp_path, tiny_model_factory):
    s = Settings(data_dir=tmp_path / "data")
    manifest = ModelStore(s.models_dir).import_path(tiny_model_factory(), model_id="tiny-draft")
    s.speculative = "tiny-draft"
    assert engine_args(s)["speculative"] == f"draft:{manifest.path}"
    gguf = tiny_model_factory()
    s.speculative = str(gguf)
    assert engine_args(s)["speculative"] == f"draft:{gguf.resolve()}"


def test_a_draft_model_that_is_gone_turns_speculation_off(tmp_path, caplog):
    s = Settings(data_dir=tmp_path, speculative="deleted-model")
    assert engine_args(s)["speculative"] == "off"
    s.speculative = str(tmp_path / "missing.gguf")
    assert engine_args(s)["speculative"] == "off"
    assert "without speculative decoding" in caplog.text


def test_the_supervisor_and_ember_serve_pass_it_to_the_engine(tmp_path, tiny_model_factory):
    s = Settings(data_dir=tmp_path, speculative="ngram")
    assert flag_value(EngineSupervisor(s, model_id="m")._command(port=0)) == "ngram"
    assert serve_args(ember_parser().parse_args(["serve"]), s).speculative == "ngram"
    typed = serve_args(ember_parser().parse_args(["serve", "--speculative", "draft:/x.gguf"]), s)
    assert typed.speculative == "draft:/x.gguf"  # a typed flag wins over the settings
    manifest = ModelStore(s.models_dir).import_path(tiny_model_factory(), model_id="tiny-draft")
    s.speculative = "tiny-draft"
    assert flag_value(EngineSupervisor(s, model_id="m")._command(port=0)) == f"draft:{manifest.path}"
