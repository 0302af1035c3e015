"""`ember serve`: the engine's OpenAI-compatible server, headless, with defaults from the settings.

The same server as `python -m engine serve` (engine/server/cli.py), run in this process; the
flags default to the user's settings (host, port, API key, backend, device, model store,
default model), so `ember serve` serves what the desktop app would.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def _settings_defaults() -> tuple[dict, str | None]:
    try:
        from app.settings import Settings, settings_path
    except ModuleNotFoundError:
        return {}, None
    s = Settings.load()
    return ({"model_id": s.default_model, "models_dir": str(s.models_dir), "host": s.server_host,
             "port": s.server_port, "api_key": s.api_key, "backend": s.backend, "device": s.device, "dtype": s.dtype,
             "kv_memory_fraction": s.kv_memory_fraction, "threads": s.threads},
            str(settings_path()))


def register(sub) -> None:
    from engine.server.cli import add_serve_args

    p = sub.add_parser("serve", help="run the OpenAI-compatible server (no window)")
    p.set_defaults(func=_run)
    add_serve_args(p, defaults=None)


def _run(args) -> int:
    from engine.server.cli import serve

    defaults, where = _settings_defaults()
    # a flag left at its parser default takes the settings' value instead
    for key, value in defaults.items():
        if getattr(args, key, None) in (None, _PARSER_DEFAULTS.get(key)) and value is not None:
            setattr(args, key, value)
    if where and getattr(args, "api_key", None) == defaults.get("api_key"):
        log.info("API key: the one in %s (clients send 'Authorization: Bearer <key>')", where)
    return serve(args)


_PARSER_DEFAULTS = {"host": "127.0.0.1", "port": 8765, "backend": "auto", "device": "auto", "dtype": "auto",
                    "kv_memory_fraction": 0.25}
