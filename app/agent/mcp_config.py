"""`mcp.json`: the user's MCP servers in the notation Claude Desktop, Cursor and Cline share.

    {"mcpServers": {"name": {"command": "...", "args": [...], "env": {...}}        # stdio
                             | {"url": "http://...", "headers": {...}}}}            # Streamable HTTP

Cline's optional per-server keys are kept too: `disabled` (configured but off) and `autoApprove` (the
tools the user always allows). Unknown keys are kept as they were, so a file shared with another app
round-trips. A broken file is an error naming the problem, never a silently empty list.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FILE_NAME = "mcp.json"


class McpConfigError(ValueError):
    """mcp.json (or an entry in it) cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One MCP server: a command to start (stdio) or a URL to connect to (Streamable HTTP)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    disabled: bool = False
    auto_approve: tuple[str, ...] = ()  # tool names the user always allows
    extra: dict[str, Any] = field(default_factory=dict)  # keys of other apps, written back as they were

    @property
    def transport(self) -> str:
        return "http" if self.url else "stdio"

    @property
    def launch(self) -> tuple:
        """What starting the server depends on: a change here restarts it, an autoApprove edit does not."""
        return (self.command, self.args, tuple(sorted(self.env.items())), self.url,
                tuple(sorted(self.headers.items())), self.disabled)

    def describe(self) -> str:
        """What the server is, in a line: its command or its URL."""
        return self.url or " ".join([self.command or "", *self.args]).strip()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        if self.url:
            out["url"] = self.url
            if self.headers:
                out["headers"] = dict(self.headers)
        else:
            out["command"] = self.command
            out["args"] = list(self.args)
            if self.env:
                out["env"] = dict(self.env)
        if self.disabled:
            out["disabled"] = True
        if self.auto_approve:
            out["autoApprove"] = list(self.auto_approve)
        return out


def _strings(value: Any, what: str, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise McpConfigError(f"server {name!r}: {what} must be an object of strings")
    return {str(k): v for k, v in value.items()}


def parse_server(name: str, entry: Any) -> ServerConfig:
    """One `mcpServers` entry -> ServerConfig, or McpConfigError saying what is wrong with it."""
    if not isinstance(entry, dict):
        raise McpConfigError(f"server {name!r}: its entry must be an object")
    command, url = entry.get("command"), entry.get("url") or entry.get("serverUrl")
    if bool(command) == bool(url):
        raise McpConfigError(f"server {name!r}: give either a \"command\" (stdio) or a \"url\" (HTTP)")
    if url and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        raise McpConfigError(f"server {name!r}: the url must start with http:// or https://")
    if command is not None and not isinstance(command, str):
        raise McpConfigError(f"server {name!r}: \"command\" must be a string")
    args = entry.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpConfigError(f"server {name!r}: \"args\" must be a list of strings")
    approve = entry.get("autoApprove") or []
    if not isinstance(approve, list) or not all(isinstance(a, str) for a in approve):
        raise McpConfigError(f"server {name!r}: \"autoApprove\" must be a list of tool names")
    known = {"command", "args", "env", "url", "serverUrl", "headers", "disabled", "autoApprove", "type"}
    return ServerConfig(name=name, command=command, args=tuple(args), env=_strings(entry.get("env"), "env", name),
                        url=url, headers=_strings(entry.get("headers"), "headers", name),
                        disabled=bool(entry.get("disabled", False)), auto_approve=tuple(approve),
                        extra={k: v for k, v in entry.items() if k not in known})


def parse_config(data: Any) -> dict[str, ServerConfig]:
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers", {}), dict):
        raise McpConfigError("mcp.json must be an object with an \"mcpServers\" object")
    return {str(name): parse_server(str(name), entry) for name, entry in data.get("mcpServers", {}).items()}


def load_config(path: Path) -> dict[str, ServerConfig]:
    """The servers of `path`; none when the file does not exist yet."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise McpConfigError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    try:
        return parse_config(data)
    except McpConfigError as exc:
        raise McpConfigError(f"{path}: {exc}") from None


def save_config(path: Path, servers: dict[str, ServerConfig]) -> None:
    """Write atomically (a temporary file renamed over the old one), readable by the user only:
    entries can hold API keys in `env` or `headers`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"mcpServers": {n: s.to_json() for n, s in servers.items()}}, indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".mcp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def claude_desktop_config_path(home: Path | None = None) -> Path:
    """Where Claude Desktop keeps its servers on this platform (it may not exist)."""
    home = home or Path.home()
    if sys.platform == "darwin":
        return home / "Library/Application Support/Claude/claude_desktop_config.json"
    if sys.platform == "win32":
        return Path(os.environ.get("APPDATA", home / "AppData/Roaming")) / "Claude/claude_desktop_config.json"
    return Path(os.environ.get("XDG_CONFIG_HOME", home / ".config")) / "Claude/claude_desktop_config.json"


def merge_imported(current: dict[str, ServerConfig], imported: dict[str, ServerConfig]) -> tuple[
        dict[str, ServerConfig], list[str]]:
    """Add the imported servers whose names are new; (the result, the names added). A name already
    configured is left as the user has it."""
    added = [n for n in imported if n not in current]
    return {**current, **{n: imported[n] for n in added}}, added
