"""`ember` and its subcommands. Each command lives in its own module with a `register(sub)`."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

# module -> registers one or more subcommands; imported lazily so `ember --help` stays fast
COMMAND_MODULES = (
    "app.cli_chat",  # chat, generate
    "app.cli_serve",  # serve
    "app.cli_models",  # models list|search|pull|rm|import|verify
    "app.bench",  # bench decode|kv|throughput|server
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ember", description="Run language models on this machine.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    register_commands(sub, COMMAND_MODULES)
    return parser


def register_commands(sub, module_names) -> None:
    """Each module adds its subcommands; a module that is not installed is skipped, while an
    import error inside one that is still surfaces."""
    for name in module_names:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        module.register(sub)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command is None:
        return _default(argv)
    return int(args.func(args) or 0)


def _default(argv: list[str]) -> int:
    """Plain `ember` starts the desktop app; until a display is available, the terminal chat."""
    try:
        gui = importlib.import_module("app.gui_main")
    except ModuleNotFoundError as e:
        if e.name != "app.gui_main":
            raise
        return main(["chat", *argv])
    return int(gui.main(argv) or 0)


if __name__ == "__main__":
    sys.exit(main())
