"""`python -m engine serve`: parse flags, build the engine thread and the app, run uvicorn.

The socket is bound here (not by uvicorn), so `--port 0` gets a free port from the OS and the
port is known before serving starts: it is logged and written to `--ready-file` as
{"port", "pid", "host"} (atomically), which is how a parent process learns it. The model loads
on the engine thread after the server is listening; /health says loading → ready | error.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

from engine.backends.cli_args import add_backend_args
from engine.server.auth import check_bind, is_loopback

log = logging.getLogger("engine.server")


def add_serve_args(p: argparse.ArgumentParser, defaults: dict | None = None) -> None:
    d = defaults or {}
    g = p.add_mutually_exclusive_group()
    g.add_argument("--model-id", default=d.get("model_id"), help="model id from the store (default: the bundled model)")
    g.add_argument("--model", default=None, metavar="PATH", help="a .gguf file or GPTQ/AWQ directory")
    p.add_argument("--models-dir", default=d.get("models_dir"), help="the model store (<dir>/<id>/manifest.json)")
    p.add_argument("--host", default=d.get("host", "127.0.0.1"))
    p.add_argument("--port", type=int, default=d.get("port", 8765), help="0 picks a free port")
    p.add_argument("--api-key", default=d.get("api_key"),
                   help="required Bearer key (also EMBER_API_KEY; --api-key-file keeps it out of `ps`)")
    p.add_argument("--api-key-file", default=None, help="read the API key from this file")
    add_backend_args(p, d)
    p.add_argument("--ready-file", default=None, help='write {"port", "pid"} here once listening')
    p.add_argument("--allow-remote", action="store_true", help="allow binding a non-loopback address (needs a key)")
    p.add_argument("--allowed-host", action="append", default=[], help="extra Host header names to accept")
    p.add_argument("--cors-origin", action="append", default=[], help="browser origin allowed by CORS")
    p.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's, ≤ 4096)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="sequences batched together")
    p.add_argument("--num-kv-blocks", type=int, default=None, help="fixed KV pool size in blocks")
    p.add_argument("--kv-memory-fraction", type=float, default=d.get("kv_memory_fraction", 0.25))
    p.add_argument("--threads", type=int, default=d.get("threads"))
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="The Ember engine process.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_args(sub.add_parser("serve", help="OpenAI-compatible server"))
    return parser


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


def serve(args) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # refuse a dangerous bind before importing torch and friends
        api_key = resolve_api_key(args)
        check_bind(args.host, args.allow_remote, api_key)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import uvicorn

    from engine.server.app import ServerSettings, create_app
    from engine.server.engine_thread import EngineThread
    from engine.server.loading import make_engine_factory
    from engine.server.model_store import DEFAULT_MODEL_ID, ModelNotFound, ModelStore, spec_from_path

    try:
        store = ModelStore(args.models_dir)
        spec = spec_from_path(args.model) if args.model else store.get(args.model_id or DEFAULT_MODEL_ID)
    except (ValueError, ModelNotFound, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not api_key:
        log.warning("no API key set: any program on this machine can use the server")
    config_kw = {"dtype": args.dtype, "max_model_len": args.max_model_len, "max_num_seqs": args.max_num_seqs,
                 "num_kv_blocks": args.num_kv_blocks, "kv_memory_fraction": args.kv_memory_fraction,
                 "num_threads": args.threads}
    thread = EngineThread(make_engine_factory(args.backend, args.device, **config_kw))
    # a remote bind is protected by its key; its Host names are whatever the network calls it
    remote = args.allow_remote and not is_loopback(args.host)
    allowed = tuple(args.allowed_host) or (("*",) if remote else ())
    app = create_app(thread, ServerSettings(api_key=api_key, models_dir=args.models_dir,
                                            allowed_hosts=allowed, cors_origins=tuple(args.cors_origin)))
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as e:
        print(f"error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2
    port = sock.getsockname()[1]
    thread.start()
    thread.load(spec)
    server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level, access_log=False,
                                           timeout_graceful_shutdown=5))

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.02)
        if server.started:
            log.info("Ember engine listening on http://%s:%d (pid %d)", args.host, port, os.getpid())
            if args.ready_file:
                write_ready_file(args.ready_file, {"port": port, "pid": os.getpid(), "host": args.host})
    threading.Thread(target=announce, name="announce", daemon=True).start()
    server.run(sockets=[sock])
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return serve(args)
