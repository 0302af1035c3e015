"""`ember mcp list`: the MCP servers of an mcp.json, each started, with its state and its tools.

The file is the desktop app's (mcp.json next to the settings file) unless `--mcp FILE` names another;
`ember chat --mcp FILE` and `ember generate --mcp FILE` read their servers through `load_servers` too.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from app.agent.mcp_config import ServerConfig
    from app.agent.mcp_connection import ServerState
    from app.agent.mcp_host import McpHost


def register(sub: argparse._SubParsersAction) -> None:
    mcp = sub.add_parser("mcp", help="the MCP servers whose tools chats may call")
    msub = mcp.add_subparsers(dest="mcp_command", metavar="ACTION", required=True)
    p = msub.add_parser("list", help="start each server and show its state and its tools "
                                     "(exits 1 when a server fails to start)")
    p.add_argument("--mcp", metavar="FILE", default=None,
                   help="an mcp.json in Claude Desktop's notation (default: mcp.json next to the settings file)")
    p.set_defaults(func=cmd_list)


def default_config_path() -> Path:
    """The desktop app's mcp.json: next to its settings file."""
    from app.agent.mcp_config import FILE_NAME
    from app.settings import Settings

    return Settings.load().path.parent / FILE_NAME


def load_servers(path: Path, must_exist: bool = True) -> dict[str, ServerConfig]:
    """The servers of `path`; SystemExit with the reason in words when the file is missing or broken."""
    from app.agent.mcp_config import McpConfigError, load_config

    if must_exist and not path.is_file():
        raise SystemExit(f"error: {path}: no such file (an mcp.json with an \"mcpServers\" object)")
    try:
        return load_config(path)
    except (McpConfigError, OSError) as e:
        raise SystemExit(f"error: {e}") from None


def quiet_host_log(verbose: bool) -> None:
    """A failed server is reported in words by the command; its log lines (and the servers' stderr)
    reach the terminal only under -v."""
    if not verbose:
        logging.getLogger("app.agent.mcp").setLevel(logging.ERROR)


def start_servers(host: McpHost, servers: dict[str, ServerConfig]) -> dict[str, ServerState]:
    """Start every enabled server and wait until each is ready or failed; a disabled one keeps its state."""
    host.start([name for name, cfg in servers.items() if not cfg.disabled])
    return host.states()


def first_line(text: str, limit: int = 100) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def print_servers(servers: dict[str, ServerConfig], states: dict[str, ServerState], out: TextIO,
                  tools: bool = True, prefix: str = "") -> None:
    """Each server: name, what it runs, its state in words; with `tools`, each tool and what it does."""
    for name, cfg in servers.items():
        state = states.get(name)
        print(f"{prefix}{name} ({cfg.transport}: {cfg.describe()}): {state.describe() if state else 'stopped'}",
              file=out)
        for tool in (state.tools if state and tools else ()):
            allowed = " [always allowed]" if tool.name in cfg.auto_approve else ""
            about = first_line(tool.description)
            print(f"  {tool.name}{allowed}" + (f": {about}" if about else ""), file=out)


def cmd_list(args: argparse.Namespace) -> int:
    from app.agent.mcp_connection import ServerStatus
    from app.agent.mcp_host import McpHost

    path = Path(args.mcp).expanduser() if args.mcp else default_config_path()
    servers = load_servers(path, must_exist=bool(args.mcp))
    if not servers:
        print(f"No MCP servers in {path}" + ("" if path.is_file() else " (the file does not exist)"))
        return 0
    quiet_host_log(args.verbose)
    host = McpHost(servers)
    try:
        states = start_servers(host, servers)
    finally:
        host.close()
    print(f"MCP servers in {path}:")
    print_servers(servers, states, sys.stdout)
    return 1 if any(s.status is ServerStatus.FAILED for s in states.values()) else 0
