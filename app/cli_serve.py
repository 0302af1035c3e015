"""`ember serve`: the engine's OpenAI-compatible server, headless, with defaults from the settings.

The same server and flags as `python -m engine serve` (engine/serve.py), run in this
process; its parser defaults are the engine's (EngineConfig's for the engine's knobs). A flag
left at that default takes the user's settings instead (host, port, API key, backend, device,
dtype, KV share, threads, model store, default model: `engine_args`, the mapping the desktop
app's engine uses too), so `ember serve` serves what the desktop app would.
"""
from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)


def register(sub) -> None:
    from engine.serve import add_serve_args

    p = sub.add_parser("serve", help="run the OpenAI-compatible server (no window)")
    p.set_defaults(func=_run)
    add_serve_args(p)


def serve_args(args: argparse.Namespace, settings) -> argparse.Namespace:
    """`args` with each flag that is still at the engine's default taken from the settings.

    (A flag typed at exactly its default value cannot be told apart: it takes the settings' too.)"""
    from app.engine_process import engine_args
    from engine.serve import serve_defaults

    defaults = serve_defaults()
    merged = argparse.Namespace(**vars(args))
    for dest, value in engine_args(settings).items():
        if getattr(args, dest, None) in (None, defaults.get(dest)) and value is not None:
            setattr(merged, dest, value)
    return merged


def _run(args) -> int:
    from app.api_pull import SettingsPuller
    from app.cli import TERMINAL_HANDLER
    from app.settings import Settings
    from engine.serve import serve

    # a server's console is its log: --log-level (info by default) reaches Ember's own loggers too,
    # so the backend decision and the kernels' path show as they do in the desktop app's engine log
    for handler in logging.getLogger().handlers:
        if handler.get_name() == TERMINAL_HANDLER and handler.level > logging.DEBUG:  # not under -v
            handler.setLevel(args.log_level.upper())
    settings = Settings.load()
    if args.api_key is None and args.api_key_file is None:
        log.info("API key: the one in %s (clients send 'Authorization: Bearer <key>')", settings.path)
    return serve(serve_args(args, settings), make_puller=SettingsPuller)
