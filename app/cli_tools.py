"""`ember generate --mcp FILE PROMPT` and `ember chat --mcp FILE`: the model with the tools of MCP servers.

The engine's server is what writes `tools` into the model's template and parses its calls, so with
--mcp the model runs in an engine child process (app/engine_process.py, as the desktop app's) rather
than in this one, and the agent loop (app/agent/loop.py) talks to it over HTTP. The child and the
servers start together and stop when the command ends, Ctrl-C included; the child has a session of
its own, so a Ctrl-C that stops a reply reaches this process alone.
"""
from __future__ import annotations

import argparse
import secrets
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from app.cli_model import installed_load_settings, installed_mmproj, installed_template, resolve_model

ENGINE_START_TIMEOUT_S = 600.0  # a big model's first load


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def add_tool_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mcp", metavar="FILE", default=None,
                   help="MCP servers whose tools the model may call (an mcp.json in Claude Desktop's notation); "
                        "the model then runs in an engine process")
    p.add_argument("--yes", "-y", action="store_true",
                   help="with --mcp: allow every tool call without asking (for runs nobody watches)")
    p.add_argument("--max-steps", type=_positive, default=10, metavar="N",
                   help="with --mcp: replies with tool calls in one turn before the model must answer (default 10)")
    p.add_argument("--tool-timeout", type=float, default=60.0, metavar="S",
                   help="with --mcp: seconds a tool call may take before it is cancelled (default 60)")


def engine_argv(args: argparse.Namespace) -> list[str]:
    """The engine child's `serve` flags: the model and its flags as the in-process commands read them
    (an installed model's own settings where a flag is not given)."""
    from app.engine_process import to_argv

    load = installed_load_settings(args.model)
    return to_argv({"model": resolve_model(args.model), "host": "127.0.0.1", "backend": args.backend,
                    "device": args.device if args.device != "auto" else load.device or "auto",
                    "dtype": args.dtype, "weights": args.weights, "kv_cache_dtype": args.kv_cache_dtype,
                    "speculative": args.speculative,
                    "chat_template": args.chat_template or installed_template(args.model),
                    "mmproj": args.mmproj or installed_mmproj(args.model),
                    "max_model_len": args.ctx or load.context_length, "threads": args.threads or load.threads,
                    "max_loaded_models": 1, "keep_alive": "-1"})


def request_sampling(args: argparse.Namespace) -> dict:
    """The sampling flags as the chat request's fields."""
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
                "repetition_penalty": args.repeat_penalty, "frequency_penalty": args.frequency_penalty,
                "presence_penalty": args.presence_penalty, "seed": args.seed, "max_tokens": args.max_tokens,
                "stop": list(args.stop) or None, "ignore_eos": args.ignore_eos or None}
    if args.think is not None:
        sampling["chat_template_kwargs"] = {"enable_thinking": args.think}
    return sampling


class ToolSession:
    """The engine child, its client and the MCP host of one command. `open()` starts them (SystemExit
    in words when the file is broken or the engine does not start); `close()` stops them all."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.engine = self.host = self.client = None
        self.servers: dict = {}
        self.toolbox = None
        self.always_allowed: set[tuple[str, str]] = set()
        self.context_tokens: int | None = None

    def open(self) -> ToolSession:
        from app.agent.mcp_host import McpHost
        from app.agent.toolbox import Toolbox
        from app.cli_mcp import load_servers, print_servers, quiet_host_log, start_servers

        self.servers = load_servers(Path(self.args.mcp).expanduser())
        argv = engine_argv(self.args)  # a bad --model fails here, before anything starts
        quiet_host_log(self.args.verbose)
        self._spawn_engine(argv)
        self.host = McpHost(self.servers)
        states = start_servers(self.host, self.servers)  # while the engine loads
        print_servers(self.servers, states, sys.stderr, tools=False, prefix="MCP server ")
        self.toolbox = Toolbox.of(t for s in states.values() for t in s.tools)
        self.always_allowed = {(n, t) for n, cfg in self.servers.items() for t in cfg.auto_approve}
        self._wait_engine()
        return self

    def _spawn_engine(self, argv: list[str]) -> None:
        from app.engine_process import EngineProcess
        from app.settings import Settings

        log_path = Settings.load().logs_dir / "engine-cli.log"
        self.engine = EngineProcess(argv, api_key=secrets.token_urlsafe(24), log_path=log_path, grace=5.0,
                                    new_session=True)
        self.engine.spawn()

    def _wait_engine(self) -> None:
        from app.client import EngineClient

        try:
            self.engine.wait_ready(ENGINE_START_TIMEOUT_S)
        except (RuntimeError, TimeoutError) as e:
            raise SystemExit(f"error: the engine did not start: {e}") from None
        self.client = EngineClient(self.engine.base_url, api_key=self.engine.api_key)
        self.context_tokens = self.client.status().get("max_model_len")

    def close(self) -> None:
        for part, stop in ((self.client, "close"), (self.host, "close"), (self.engine, "stop")):
            if part is not None:
                getattr(part, stop)()

    def turn(self, messages: list[dict], view) -> tuple[str, bool]:
        """One user turn to its answer, shown on `view`: (the answer's text, whether Ctrl-C stopped it).
        `messages` grows with the calls and their results; the caller appends the answer."""
        from app.agent.loop import AgentConfig, AgentRun, ReplyStarted
        from app.client import ChatDelta

        config = AgentConfig(step_limit=self.args.max_steps, call_timeout_s=self.args.tool_timeout)
        run = AgentRun(self.client, messages, self.toolbox, self.host, view.approve, config,
                       sampling=request_sampling(self.args), context_tokens=self.context_tokens,
                       always_allowed=self.always_allowed)
        view.on_interrupt = run.cancel
        answer = ""
        try:
            with _sigint_calls(run.cancel):
                for event in run.run():
                    if isinstance(event, ReplyStarted):
                        answer = ""
                    elif isinstance(event, ChatDelta):
                        answer += event.text
                    view.show(event)
        finally:
            view.finish(stopped=run.cancelled)  # the terminal's colour back, even after an engine error
        return answer, run.cancelled


@contextmanager
def _sigint_calls(handler: Callable[[], None]) -> Iterator[None]:
    """Ctrl-C calls `handler` (the run's cancel) instead of raising, on the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda *_: handler())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def tool_session(args: argparse.Namespace) -> Iterator[ToolSession]:
    session = ToolSession(args)
    try:
        yield session.open()
    finally:
        session.close()


def run_generate_tools(args: argparse.Namespace) -> int:
    from app.cli_tool_view import TerminalView
    from app.client import EngineClientError

    if args.raw:
        raise SystemExit("error: --raw completes plain text, which calls no tools: leave out --raw or --mcp")
    try:
        with tool_session(args) as session:
            _answer, stopped = session.turn([{"role": "user", "content": args.prompt}], TerminalView(args.yes))
    except EngineClientError as e:
        raise SystemExit(f"\nerror: {e}") from None
    except KeyboardInterrupt:
        print("\nstopped", file=sys.stderr)
        return 130
    return 0


@contextmanager
def tool_chat(args: argparse.Namespace) -> Iterator[Callable[[list[dict]], str]]:
    """`ember chat`'s reply function with tools: history -> the answer (ValueError when the engine
    refuses the request: the chat drops the turn and goes on)."""
    from app.cli_tool_view import TerminalView
    from app.client import EngineClientError

    with tool_session(args) as session:
        tools = len(session.toolbox.tools)
        print(f"{tools} tool{'s' if tools != 1 else ''} from {args.mcp}; "
              + ("every call allowed (--yes)." if args.yes else "each call asks first."), file=sys.stderr)

        def reply(history: list[dict]) -> str:
            try:
                return session.turn(history, TerminalView(args.yes))[0]
            except EngineClientError as e:
                raise ValueError(str(e)) from None

        yield reply
