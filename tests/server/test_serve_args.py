"""One declaration per engine setting: the `serve` flags come from EngineConfig, and one mapping
(`engine_args`) turns the user's settings into the engine's arguments for the desktop app's
engine (the supervisor) and `ember serve` alike. Parsing only: no engine starts here."""
from __future__ import annotations

import argparse
import dataclasses
import typing

import pytest

from app.cli import build_parser as ember_parser
from app.cli_serve import serve_args
from app.engine_process import engine_args, to_argv
from app.settings import Settings
from app.supervisor import EngineSupervisor
from engine.config import EngineConfig
from engine.serve import CONFIG_FLAGS, add_serve_args, config_kwargs
from engine.serve import build_parser as engine_parser

CONFIG_DEFAULTS = {f.name: f.default for f in dataclasses.fields(EngineConfig)}


def test_serve_defaults_are_engine_config_defaults():
    want = {name: CONFIG_DEFAULTS[name] for name in ("dtype", "weights", "kv_cache_dtype", "speculative", "chat_template", *CONFIG_FLAGS)}
    engine = engine_parser().parse_args(["serve"])  # python -m engine serve: the GUI's engine
    assert config_kwargs(engine) == want
    ember = ember_parser().parse_args(["serve"])
    assert config_kwargs(ember) == want
    # ...and with the user's settings applied, as `ember serve` runs: fresh settings change none of them
    # but one: the prefix cache's disk tier is on, inside the data folder
    settings = Settings.load()
    assert config_kwargs(serve_args(ember, settings)) == want | {"kv_disk_dir": str(settings.kv_cache_dir)}


def test_every_serve_knob_is_declared_by_its_engine_config_field():
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    hints = typing.get_type_hints(EngineConfig)
    for name, flag in CONFIG_FLAGS.items():
        field = next(f for f in dataclasses.fields(EngineConfig) if f.name == name)
        action = next(a for a in parser._actions if flag in a.option_strings)
        assert action.help == field.metadata["help"] and action.default == field.default, name
        if hints[name] is bool:  # --flag / --no-flag
            assert isinstance(action, argparse.BooleanOptionalAction), name
        else:
            assert action.type in typing.get_args(hints[name]) or action.type is hints[name], name


def test_ember_serve_takes_the_settings_where_no_flag_is_typed(tmp_path):
    s = Settings(data_dir=tmp_path, server_port=9100, threads=3, dtype="float32", backend="torch",
                 kv_memory_fraction=0.5)
    args = serve_args(ember_parser().parse_args(["serve", "--threads", "1", "--max-num-seqs", "8"]), s)
    assert (args.port, args.dtype, args.backend, args.kv_memory_fraction) == (9100, "float32", "torch", 0.5)
    assert (args.threads, args.max_num_seqs) == (1, 8)  # typed: the command line wins
    assert (args.model_id, args.models_dir, args.api_key) == (s.default_model, str(s.models_dir), s.api_key)


@pytest.mark.parametrize("keyless", [False, True])
def test_the_supervisor_and_ember_serve_share_one_mapping(tmp_path, keyless):
    s = Settings(data_dir=tmp_path, server_port=9100, threads=2, dtype="bfloat16", device="cpu",
                 ollama_port=11434, ollama_keyless=keyless)
    cmd = EngineSupervisor(s, model_id="some-model")._command(port=0)
    served = serve_args(ember_parser().parse_args(["serve"]), s)
    for dest, value in engine_args(s).items():
        if dest in ("port", "api_key"):  # the launcher's own --port; the key travels in the environment
            continue
        flag = "--" + dest.replace("_", "-")
        assert getattr(served, dest) == value, dest
        if isinstance(value, bool):  # a switch: there or not
            assert (flag in cmd) == value, dest
            continue
        if value is None:  # unset: left to the engine's default
            assert flag not in cmd, dest
            continue
        want = "some-model" if dest == "model_id" else str(value)
        assert cmd[cmd.index(flag) + 1] == want, dest
    parsed = engine_parser().parse_args(cmd[cmd.index("serve"):])  # the child's own parser reads it back
    assert (parsed.ollama_port, parsed.ollama_keyless) == (11434, keyless)
    assert s.api_key not in cmd
    assert cmd[cmd.index("--port") + 1] == "0" and "--ready-file" in cmd


def test_to_argv_keeps_the_key_off_the_command_line():
    assert to_argv({"max_num_seqs": 16, "allow_remote": True, "threads": None, "x": False}) == \
        ["--max-num-seqs", "16", "--allow-remote"]
    with pytest.raises(ValueError, match="environment"):
        to_argv({"api_key": "secret-key"})


def test_settings_defaults_match_engine_config_where_they_overlap(tmp_path):
    s = Settings(data_dir=tmp_path)
    assert s.kv_memory_fraction == CONFIG_DEFAULTS["kv_memory_fraction"]
    assert s.dtype == CONFIG_DEFAULTS["dtype"]
    assert s.threads == CONFIG_DEFAULTS["num_threads"]


def test_the_residency_settings_reach_the_engine_childs_argv(tmp_path):
    """The budget, the most models at once and keep_alive: Settings → the supervisor's child and `ember serve`."""
    defaults = engine_parser().parse_args(["serve"])
    assert (defaults.memory_budget, defaults.max_loaded_models, defaults.keep_alive) == (0.0, 3, "5m")
    fresh = Settings(data_dir=tmp_path)
    assert (fresh.memory_budget_gb, fresh.max_loaded_models, fresh.keep_alive) == (0.0, 3, "5m")
    for keep in ("1h30m", "-1m", "-1", "0"):  # "-1m" must not read as an option on the child's command line
        s = Settings(data_dir=tmp_path, memory_budget_gb=6.5, max_loaded_models=2, keep_alive=keep)
        cmd = EngineSupervisor(s, model_id="some-model")._command(port=0)
        child = engine_parser().parse_args(cmd[cmd.index("serve"):])
        assert (child.memory_budget, child.max_loaded_models, child.keep_alive) == (6.5, 2, keep)
        served = serve_args(ember_parser().parse_args(["serve"]), s)
        assert (served.memory_budget, served.max_loaded_models, served.keep_alive) == (6.5, 2, keep)
    typed = serve_args(ember_parser().parse_args(["serve", "--keep-alive", "10m", "--max-loaded-models", "4"]), s)
    assert (typed.keep_alive, typed.max_loaded_models, typed.memory_budget) == ("10m", 4, 6.5)  # typed flags win


@pytest.mark.parametrize("argv", [["--keep-alive", "5x"], ["--keep-alive", ""], ["--max-loaded-models", "0"],
                                  ["--max-loaded-models", "17"], ["--memory-budget", "-1"]])
def test_bad_residency_flags_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        engine_parser().parse_args(["serve", *argv])
    assert argv[0] in capsys.readouterr().err
