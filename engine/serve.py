"""`python -m engine serve`: parse flags, build the engine thread and the app, run uvicorn.

The socket is bound here (not by uvicorn), so `--port 0` gets a free port from the OS and the
port is known before serving starts: it is logged and written to `--ready-file` as
{"port", "pid", "host"} (atomically), which is how a parent process learns it. The model loads
on the engine thread after the server is listening; /health says loading → ready | error.

The engine's knobs are EngineConfig's fields: their flags, types, defaults and help are generated
from it (`CONFIG_FLAGS`), so `python -m engine serve` and `ember serve` default to EngineConfig.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import socket
import sys
import threading
import time
import typing
from pathlib import Path

from engine.backends.cli_args import add_backend_args
from engine.config import EngineConfig
from engine.keep_alive import parse_keep_alive
from engine.server.auth import check_bind, is_loopback

if typing.TYPE_CHECKING:
    from engine.server.ollama.pull import Puller
    from engine.service.residency import ResidencyConfig

log = logging.getLogger("engine.server")

# EngineConfig field -> its `serve` flag (the argparse dest is the flag's name)
CONFIG_FLAGS = {"max_model_len": "--max-model-len", "max_num_seqs": "--max-num-seqs",
                "num_kv_blocks": "--num-kv-blocks", "kv_memory_fraction": "--kv-memory-fraction",
                "kv_idle_cache_tokens": "--kv-idle-cache-tokens", "num_threads": "--threads",
                "num_speculative_tokens": "--num-speculative-tokens", "exact_greedy": "--exact-greedy",
                "kv_disk_dir": "--kv-disk-dir", "kv_disk_budget_gib": "--kv-disk-budget-gib"}
CONFIG_FIELDS = {f.name: f for f in dataclasses.fields(EngineConfig)}


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def _base_type(annotation) -> type:
    """`int | None` -> int."""
    return next((a for a in typing.get_args(annotation) if a is not type(None)), annotation)


def add_config_args(p: argparse.ArgumentParser, defaults: dict | None = None) -> None:
    """The CONFIG_FLAGS options, each with its EngineConfig field's type, default and help."""
    d = defaults or {}
    hints = typing.get_type_hints(EngineConfig)
    for name, flag in CONFIG_FLAGS.items():
        kind, field = _base_type(hints[name]), CONFIG_FIELDS[name]
        kw = {"action": argparse.BooleanOptionalAction} if kind is bool else {"type": kind}
        p.add_argument(flag, dest=_dest(flag), default=d.get(_dest(flag), field.default),
                       help=field.metadata.get("help"), **kw)


def config_kwargs(args: argparse.Namespace) -> dict:
    """The EngineConfig fields that the flags in `args` set (dtype is one of the backend flags)."""
    return {"dtype": args.dtype, "weights": args.weights, "kv_cache_dtype": args.kv_cache_dtype,
            "speculative": args.speculative, "chat_template": args.chat_template,
            **{name: getattr(args, _dest(flag)) for name, flag in CONFIG_FLAGS.items()}}


def add_serve_args(p: argparse.ArgumentParser, defaults: dict | None = None) -> None:
    """`defaults` (by dest) replace the declared ones; `argparse.SUPPRESS` leaves an untyped flag out of args."""
    d = {"host": "127.0.0.1", "port": 8765, "allow_remote": False, "allowed_host": [], "cors_origin": [],
         "log_level": "info", "dtype": CONFIG_FIELDS["dtype"].default, **(defaults or {})}
    g = p.add_mutually_exclusive_group()
    g.add_argument("--model-id", default=d.get("model_id"), help="model id from the store (default: the bundled model)")
    g.add_argument("--model", default=d.get("model"), metavar="PATH", help="a .gguf file or GPTQ/AWQ directory")
    p.add_argument("--models-dir", default=d.get("models_dir"), help="the model store (<dir>/<id>/manifest.json)")
    p.add_argument("--docs-dir", default=d.get("docs_dir"), metavar="DIR",
                   help="the documents store of the Files and Vector Stores API (default: none, those routes answer 404)")
    p.add_argument("--embedding-model", default=d.get("embedding_model"), metavar="ID_OR_PATH",
                   help="the model that embeds documents and queries: an installed id or a GGUF file (default: "
                        "the first installed embedding model)")
    p.add_argument("--host", default=d["host"])
    p.add_argument("--port", type=int, default=d["port"], help="0 picks a free port")
    p.add_argument("--ollama-port", type=int, default=d.get("ollama_port", 0), metavar="PORT",
                   help="also serve on this port, for programs that expect Ollama at 11434 (0: off)")
    p.add_argument("--ollama-keyless", action="store_true", default=d.get("ollama_keyless", False),
                   help="programs on this computer may use the Ollama port without the API key, as Ollama's "
                        "clients expect (the key is still needed on --port; web pages are still refused)")
    p.add_argument("--api-key", default=d.get("api_key"),
                   help="required Bearer key (also EMBER_API_KEY; --api-key-file keeps it out of `ps`)")
    p.add_argument("--api-key-file", default=d.get("api_key_file"), help="read the API key from this file")
    add_backend_args(p, d)
    p.add_argument("--ready-file", default=d.get("ready_file"), help='write {"port", "pid"} here once listening')
    p.add_argument("--allow-remote", action="store_true", default=d["allow_remote"],
                   help="allow binding a non-loopback address (needs a key)")
    p.add_argument("--allowed-host", action="append", default=d["allowed_host"],
                   help="extra Host header names to accept")
    p.add_argument("--cors-origin", action="append", default=d["cors_origin"], help="browser origin allowed by CORS")
    p.add_argument("--max-reasoning-tokens", type=int, default=d.get("max_reasoning_tokens"), metavar="N",
                   help="a reasoning model thinks at most N tokens unless a request says otherwise "
                        "(default: no limit)")
    p.add_argument("--fetch-image-urls", action="store_true", default=d.get("fetch_image_urls", False),
                   help="fetch an image part's http(s) URL (default: refused with a 400; send base64 data: URIs)")
    add_config_args(p, d)
    add_residency_args(p, d)
    p.add_argument("--log-level", default=d["log_level"], choices=("debug", "info", "warning", "error"))


def add_residency_args(p: argparse.ArgumentParser, d: dict) -> None:
    """The models kept loaded at once: how much memory they share, how many, how long an idle one stays."""
    p.add_argument("--memory-budget", type=_bounded(float, 0.0, 65536.0), default=d.get("memory_budget", 0.0),
                   metavar="GIB", help="memory the loaded models may use together (weights, KV cache, buffers), "
                                       "in GiB (0: about 75%% of this machine's RAM)")
    p.add_argument("--max-loaded-models", type=_bounded(int, 1, 16), default=d.get("max_loaded_models", 3),
                   metavar="N", help="the most models loaded at the same time (1 to 16)")
    p.add_argument("--keep-alive", type=_keep_alive, default=d.get("keep_alive", "5m"), metavar="DURATION",
                   help="how long an idle model stays loaded, as Ollama's keep_alive: 5m, 1h30m, or seconds; "
                        "-1 forever, 0 unload at once (a request's own keep_alive wins)")


def _bounded(kind: type, low: float, high: float):
    def parse(text: str):
        value = kind(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is not between {low:g} and {high:g}")
        return value
    parse.__name__ = kind.__name__  # argparse's "invalid int value: 'x'"
    return parse


def _keep_alive(text: str) -> str:
    """Checked here, kept as typed: the engine reads it with parse_keep_alive."""
    try:
        parse_keep_alive(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text.strip()


def serve_defaults() -> dict:
    """Every `serve` flag's default, by dest (EngineConfig's for the engine's knobs)."""
    return {k: v for k, v in vars(build_parser().parse_args(["serve"])).items() if k != "command"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="The Ember engine process.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_args(sub.add_parser("serve", help="OpenAI-compatible server"))
    return parser


def residency_config(args) -> "ResidencyConfig":
    """--memory-budget (GiB; 0 automatic), --max-loaded-models, --keep-alive (Ollama's durations)."""
    from engine.keep_alive import parse_keep_alive
    from engine.service.residency import ResidencyConfig

    try:
        return ResidencyConfig(budget_bytes=int(args.memory_budget * 2**30), max_models=args.max_loaded_models,
                               keep_alive_s=parse_keep_alive(args.keep_alive))
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def default_spec(args):
    """The model `--model` or `--model-id` names, with `--mmproj` as its projector (that model's
    alone: other models the server loads keep their own, from the store)."""
    from engine.server.model_store import DEFAULT_MODEL_ID, ModelStore, spec_from_path

    spec = spec_from_path(args.model) if args.model else ModelStore(args.models_dir).get(args.model_id or DEFAULT_MODEL_ID)
    return dataclasses.replace(spec, mmproj=str(Path(args.mmproj).expanduser().resolve())) if args.mmproj else spec


def build_engine_thread(args):
    """The engine thread the flags describe: its factory, the file check, the residency rules."""
    from engine.service.engine_thread import EngineThread
    from engine.service.loading import check_model_file, estimate_bytes, fits_now, make_engine_factory

    residency = residency_config(args)
    return EngineThread(make_engine_factory(args.backend, args.device, **config_kwargs(args)),
                        check=check_model_file, residency=residency,
                        estimate=lambda s: estimate_bytes(s, residency, args.num_kv_blocks, args.max_model_len),
                        fits_now=fits_now)


def resolve_api_key(args) -> str | None:
    if args.api_key_file:
        return Path(args.api_key_file).read_text(encoding="utf-8").strip() or None
    return args.api_key or os.environ.get("EMBER_API_KEY") or None


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def write_ready_file(path: str, data: dict) -> None:
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, p)


def server_settings(args, api_key: str | None, default_model=None):
    """The app's ServerSettings from the flags: who may talk to it, and how; `default_model` is the
    spec a request naming no model gets when none is loaded (the one the server started with)."""
    from engine.server.app import ServerSettings

    # a remote bind is protected by its key; its Host names are whatever the network calls it
    remote = args.allow_remote and not is_loopback(args.host)
    allowed = tuple(args.allowed_host) or (("*",) if remote else ())
    if args.max_reasoning_tokens is not None and args.max_reasoning_tokens < 0:
        raise SystemExit("error: --max-reasoning-tokens must be 0 or more")
    keyless = (args.ollama_port,) if args.ollama_keyless and args.ollama_port else ()
    return ServerSettings(api_key=api_key, models_dir=args.models_dir, allowed_hosts=allowed,
                          cors_origins=tuple(args.cors_origin), keyless_ports=keyless,
                          max_reasoning_tokens=args.max_reasoning_tokens, default_model=default_model,
                          docs_dir=args.docs_dir, embedding_model=args.embedding_model,
                          fetch_image_urls=args.fetch_image_urls)


def serve(args, make_puller: typing.Callable[[str | None], Puller] | None = None) -> int:
    """`make_puller(models_dir)`: the app's downloads behind Ollama's /api/pull (see engine/server/ollama/pull.py)."""
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # refuse a dangerous bind before importing torch and friends
        api_key = resolve_api_key(args)
        check_bind(args.host, args.allow_remote, api_key)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import uvicorn

    from engine.server.app import create_app
    from engine.server.model_store import ModelNotFound

    try:
        spec = default_spec(args)
    except (ValueError, ModelNotFound, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not api_key:
        log.warning("no API key set: any program on this machine can use the server")
    thread = build_engine_thread(args)
    settings = server_settings(args, api_key, default_model=spec)
    app = create_app(thread, settings, puller=make_puller(args.models_dir) if make_puller else None)
    socks = []
    for p in (args.port, *([args.ollama_port] if args.ollama_port else [])):
        try:
            socks.append(bind_socket(args.host, p))
        except OSError as e:
            print(f"error: cannot listen on {args.host}:{p}: {e}", file=sys.stderr)
            return 2
    port = socks[0].getsockname()[1]
    thread.start()
    thread.load(spec)
    server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level, access_log=False,
                                           timeout_graceful_shutdown=5))

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.02)
        if server.started:
            log.info("Ember engine listening on http://%s:%d (pid %d)", args.host, port, os.getpid())
            if args.ollama_port:
                log.info("and on http://%s:%d for Ollama's clients%s", args.host, args.ollama_port,
                         " (without the key from this computer)" if settings.keyless_ports else "")
            if args.ready_file:
                write_ready_file(args.ready_file, {"port": port, "pid": os.getpid(), "host": args.host})
    threading.Thread(target=announce, name="announce", daemon=True).start()
    server.run(sockets=socks)
    return 0


def main(argv: list[str] | None = None, make_puller=None) -> int:
    args = build_parser().parse_args(argv)
    return serve(args, make_puller)
