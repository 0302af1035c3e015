"""Settings: defaults, bounds, EMBER_HOME, env overrides, atomic save, corrupt files, CLI flags."""
from __future__ import annotations

import argparse
import json
import logging
import os
import stat
from pathlib import Path

import pytest

from app.settings import Settings, config_dir, settings_path
from app.settings_args import add_settings_args, settings_from_args


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("EMBER_HOME", str(tmp_path))
    for name in list(os.environ):
        if name.startswith("EMBER_") and name != "EMBER_HOME":
            monkeypatch.delenv(name)
    return tmp_path


def test_first_load_generates_and_saves_a_key(home):
    s = Settings.load()
    assert settings_path() == home / "config" / "settings.json"
    assert s.data_dir == home / "data" and s.models_dir == home / "data" / "models"
    assert len(s.api_key) >= 40  # token_urlsafe(32): 43 characters
    stored = json.loads(settings_path().read_text())
    assert stored["api_key"] == s.api_key
    assert stat.S_IMODE(settings_path().stat().st_mode) == 0o600
    # the key is stable across loads, and two installs get different keys
    assert Settings.load().api_key == s.api_key
    assert Settings().api_key != s.api_key


def test_defaults_match_the_agreed_interface(home):
    s = Settings.load()
    assert (s.server_host, s.server_port, s.backend, s.device) == ("127.0.0.1", 8765, "auto", "auto")
    assert (s.kv_memory_fraction, s.threads, s.theme) == (0.25, None, "system")
    assert s.default_model == "smollm2-135m-instruct-q4_1"
    assert (s.close_to_tray, s.tray_notice_shown, s.max_parallel_downloads) == (True, False, 2)
    assert s.hub_base_url == "https://huggingface.co"
    assert s.connection_url is None and s.connection_key is None


def test_round_trip_and_relocatable_paths(home):
    s = Settings.load()
    s.server_port = 9100
    s.theme = "dark"
    s.save()
    stored = json.loads(settings_path().read_text())
    assert "data_dir" not in stored and "models_dir" not in stored  # follow EMBER_HOME, not frozen
    again = Settings.load()
    assert (again.server_port, again.theme, again.api_key) == (9100, "dark", s.api_key)
    no_tmp_left = [p.name for p in config_dir().iterdir()]
    assert no_tmp_left == ["settings.json"]


@pytest.mark.parametrize("field,value", [
    ("server_port", 70000), ("server_port", -1), ("kv_memory_fraction", 0.0), ("kv_memory_fraction", 1.5),
    ("threads", 0), ("backend", "cuda"), ("theme", "pink"), ("default_model", "Bad Name"),
    ("max_parallel_downloads", 0), ("connection_url", "ftp://x"), ("hub_base_url", ""), ("api_key", "short"),
    ("memory_budget_gb", -1.0), ("max_loaded_models", 0), ("max_loaded_models", 17), ("keep_alive", "5x"),
    ("keep_alive", ""), ("keep_alive", "1d"),
])
def test_bounds_are_enforced(home, field, value):
    s = Settings.load()
    with pytest.raises(ValueError):
        setattr(s, field, value)


def test_env_vars_override_but_are_not_persisted(home, monkeypatch):
    s = Settings.load()
    s.theme = "light"
    s.save()
    monkeypatch.setenv("EMBER_SERVER_PORT", "9001")
    monkeypatch.setenv("EMBER_THEME", "dark")
    monkeypatch.setenv("EMBER_CLOSE_TO_TRAY", "false")
    monkeypatch.setenv("EMBER_CONNECTION_URL", "http://gpu-box:8000/v1/")
    s = Settings.load()
    assert (s.server_port, s.theme, s.close_to_tray) == (9001, "dark", False)
    assert s.connection_url == "http://gpu-box:8000/v1"
    s.max_parallel_downloads = 3  # the user changes something else in the GUI and saves
    s.save()
    stored = json.loads(settings_path().read_text())
    assert stored["theme"] == "light" and stored["server_port"] == 8765 and stored["close_to_tray"] is True
    assert "connection_url" not in stored or stored["connection_url"] is None
    assert stored["max_parallel_downloads"] == 3
    s.theme = "system"  # changed after load: the user's choice wins over the env value
    s.save()
    assert json.loads(settings_path().read_text())["theme"] == "system"


def test_bad_env_value_is_ignored_with_a_warning(home, monkeypatch, caplog):
    monkeypatch.setenv("EMBER_SERVER_PORT", "not-a-port")
    with caplog.at_level(logging.WARNING, logger="app.settings"):
        s = Settings.load()
    assert s.server_port == 8765
    assert "EMBER_SERVER_PORT" in caplog.text


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", "", "\x00\xff garbage"])
def test_corrupt_file_gives_defaults_and_a_backup(home, caplog, content):
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text(content, encoding="utf-8", errors="surrogateescape")
    with caplog.at_level(logging.WARNING, logger="app.settings"):
        s = Settings.load()
    assert s.server_port == 8765
    assert "corrupt" in caplog.text and ".bak" in caplog.text
    backup = path.with_name("settings.json.bak")
    assert backup.read_text(encoding="utf-8", errors="surrogateescape") == content
    assert json.loads(path.read_text())["api_key"] == s.api_key  # a fresh, valid file replaces it


def test_invalid_values_fall_back_field_by_field(home, caplog):
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"api_key": "k" * 20, "server_port": 123456, "theme": "dark",
                                "unknown_future_field": 1}))
    with caplog.at_level(logging.WARNING, logger="app.settings"):
        s = Settings.load()
    assert (s.server_port, s.theme, s.api_key) == (8765, "dark", "k" * 20)
    assert "server_port" in caplog.text
    assert path.with_name("settings.json.bak").exists()


def test_explicit_path_and_models_dir(tmp_path, home):
    custom = tmp_path / "elsewhere" / "s.json"
    s = Settings.load(custom)
    assert custom.exists() and not settings_path().exists()
    s.data_dir = tmp_path / "big-disk"
    s.save()
    again = Settings.load(custom)
    assert again.data_dir == tmp_path / "big-disk"
    assert again.models_dir == tmp_path / "big-disk" / "models"
    again.ensure_dirs()
    assert again.models_dir.is_dir() and again.logs_dir.is_dir()


def test_cli_flags_map_onto_fields(home):
    Settings.load().save()
    parser = argparse.ArgumentParser()
    add_settings_args(parser, ["server_port", "server_host", "close_to_tray", "backend", "threads"],
                      flags={"server_port": "--port", "server_host": "--host"})
    args = parser.parse_args(["--port", "0", "--no-close-to-tray", "--backend", "llama.cpp"])
    s = settings_from_args(args)
    assert (s.server_port, s.close_to_tray, s.backend, s.server_host) == (0, False, "llama.cpp", "127.0.0.1")
    s.save()  # flags are per run: not written into the file
    stored = json.loads(settings_path().read_text())
    assert stored["server_port"] == 8765 and stored["close_to_tray"] is True
    with pytest.raises(SystemExit):
        parser.parse_args(["--backend", "vulkan"])
    with pytest.raises(ValueError, match="--threads"):
        settings_from_args(parser.parse_args(["--threads", "0"]))


def test_without_ember_home_the_platform_dirs_are_used(monkeypatch):
    import platformdirs

    from app.settings import default_data_dir

    monkeypatch.delenv("EMBER_HOME", raising=False)
    assert config_dir() == Path(platformdirs.user_config_dir("ember", appauthor=False))
    assert default_data_dir() == Path(platformdirs.user_data_dir("ember", appauthor=False))
    assert settings_path().parent == config_dir()  # nothing is written here: Settings.load() is not called


def test_keep_alive_takes_ollamas_forms(home, monkeypatch):
    """Checked by the engine's own reading (engine/keep_alive.py); a number is seconds, kept as text."""
    s = Settings.load()
    assert (s.keep_alive, s.memory_budget_gb, s.max_loaded_models, s.ollama_keyless) == ("5m", 0.0, 3, False)
    for value, kept in (("1h30m", "1h30m"), (" -1 ", "-1"), (300, "300"), (0, "0"), (-1, "-1")):
        s.keep_alive = value
        assert s.keep_alive == kept
    with pytest.raises(ValueError, match="'tomorrow'"):  # the message names the value
        s.keep_alive = "tomorrow"
    settings_path().write_text(json.dumps({"api_key": "k" * 16, "keep_alive": 600}))
    assert Settings.load().keep_alive == "600"  # a number in the file, as Ollama's JSON numbers
    monkeypatch.setenv("EMBER_KEEP_ALIVE", "-1m")
    monkeypatch.setenv("EMBER_MAX_LOADED_MODELS", "2")
    assert (Settings.load().keep_alive, Settings.load().max_loaded_models) == ("-1m", 2)
