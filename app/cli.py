"""`ember` and its subcommands. Each command lives in its own module with a `register(sub)`."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from app.frozen import ENGINE_CHILD_COMMAND
from app.version import ember_version

TERMINAL_HANDLER = "ember-terminal"  # the log handler that writes to the terminal

# module -> registers one or more subcommands; imported lazily so `ember --help` stays fast
COMMAND_MODULES = (
    "app.cli_chat",  # chat, generate
    "app.cli_serve",  # serve
    "app.cli_models",  # models list|search|pull|rm|import|verify
    "app.cli_quantize",  # quantize
    "app.cli_mcp",  # mcp list
    "app.cli_docs",  # docs add|list|rm|search
    "app.cli_cache",  # cache info|clear
    "app.bench",  # bench decode|kv|throughput|server|turns|footprint
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ember", description="Run language models on this machine.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--version", action="version", version=f"ember {ember_version()}")
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
    if argv[:1] == [ENGINE_CHILD_COMMAND]:  # a frozen bundle's engine process (app.frozen), not for users
        from app.engine_child import main as engine_child_main

        return engine_child_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_terminal_logging(args.verbose)
    if args.command is None:
        return _default(argv)
    return int(args.func(args) or 0)


def setup_terminal_logging(verbose: bool) -> None:
    """The terminal shows warnings and errors (everything with -v); a log file may take more (the GUI's).

    httpx logs every request at INFO (the GUI polls the engine each second): only with -v.
    """
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == TERMINAL_HANDLER]:  # `ember` falling back to chat
        root.removeHandler(old)
    handler = logging.StreamHandler()
    handler.set_name(TERMINAL_HANDLER)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.DEBUG if verbose else logging.WARNING)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("httpx", "httpcore", "httpx2"):  # httpx2: huggingface_hub's own copy
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)


def _default(argv: list[str]) -> int:
    """Plain `ember` starts the desktop app; without a display or Qt's libraries, the terminal chat."""
    from app.display_check import gui_problem

    problem = gui_problem()
    if problem is not None:
        print(f"ember: cannot open the window: {problem}. Starting the terminal chat (ember chat).",
              file=sys.stderr)
        return main(["chat", *argv])
    try:
        gui = importlib.import_module("app.gui_main")
    except ImportError as e:  # PySide6 missing or its libraries not loadable
        print(f"ember: cannot open the window ({e}). Starting the terminal chat (ember chat).", file=sys.stderr)
        return main(["chat", *argv])
    return int(gui.main(argv) or 0)


if __name__ == "__main__":
    sys.exit(main())
