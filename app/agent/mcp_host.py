"""The MCP servers of the app, run on one background event loop, with a plain blocking API for the
agent loop's thread, the GUI's workers and the CLI. A server starts when a chat first needs it and
stops with the host; one that fails or crashes marks itself failed with the reason, and the rest go on."""
from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Callable

from app.agent.mcp_config import ServerConfig
from app.agent.mcp_connection import Connection, ServerState, ServerStatus, ServerUnavailable, failure_words

START_TIMEOUT_S = 30.0


class ToolTimeout(TimeoutError):
    """The call ran past its timeout and was cancelled."""


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """What a tool gave back, as text for the model; `is_error` when the tool said it failed."""

    text: str
    is_error: bool = False


def content_text(blocks: Iterable[Any]) -> str:
    """MCP content blocks as plain text: text as it is, anything else as a short placeholder."""
    parts = []
    for b in blocks:
        kind = getattr(b, "type", "")
        if kind == "text":
            parts.append(b.text)
        elif kind == "resource" and hasattr(b.resource, "text"):
            parts.append(b.resource.text)
        elif kind == "resource_link":
            parts.append(f"[resource {b.uri}]")
        else:
            parts.append(f"[{kind or 'content'} {getattr(b, 'mime_type', '') or ''}]".replace(" ]", "]"))
    return "\n".join(parts)


class McpHost:
    """The configured servers, each a Connection on the host's loop thread."""

    def __init__(self, servers: dict[str, ServerConfig] | None = None,
                 on_change: Callable[[ServerState], None] | None = None,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self._on_change = on_change or (lambda state: None)
        self.start_timeout_s = start_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-host", daemon=True)
        self._thread.start()
        self._connections: dict[str, Connection] = {}
        self.configure(servers or {})

    # -- on the loop -------------------------------------------------------------------------------
    def _run(self, coro, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _configure(self, servers: dict[str, ServerConfig]) -> None:
        for name, conn in list(self._connections.items()):
            cfg = servers.get(name)
            if cfg is not None and cfg.launch == conn.cfg.launch:
                conn.cfg = cfg  # the same server: an autoApprove edit must not restart it
            else:  # removed or changed: stop, and start afresh when needed
                conn.stop()
                del self._connections[name]
                if name not in servers:
                    self._on_change(ServerState(name, ServerStatus.STOPPED))
        for name, cfg in servers.items():
            if name not in self._connections:
                self._connections[name] = Connection(cfg, self._on_change)
                self._on_change(self._connections[name].state)

    async def _start(self, names: list[str], retry: bool) -> None:
        conns = [self._connections[n] for n in names if n in self._connections
                 and self._connections[n].state.status not in (ServerStatus.DISABLED,)]
        again = (ServerStatus.STOPPED, ServerStatus.FAILED) if retry else (ServerStatus.STOPPED,)
        for conn in conns:
            if conn.state.status in again and conn.client is None:
                conn.start()
        waits = [conn.ready.wait() for conn in conns if conn.ready is not None]
        if waits:
            try:
                await asyncio.wait_for(asyncio.gather(*waits), self.start_timeout_s)
            except asyncio.TimeoutError:
                for conn in conns:
                    if conn.state.status is ServerStatus.STARTING:
                        conn.fail(f"did not start within {self.start_timeout_s:g} s")

    async def _call(self, server: str, tool: str, arguments: dict, timeout_s: float) -> ToolOutput:
        conn = self._connections.get(server)
        if conn is None or conn.client is None:
            reason = conn.state.error if conn is not None and conn.state.error else "it is not running"
            raise ServerUnavailable(f"the MCP server {server!r} is unavailable: {reason}")
        try:
            result = await asyncio.wait_for(conn.client.call_tool(tool, arguments), timeout_s)
        except asyncio.TimeoutError:
            raise ToolTimeout(f"{tool} took longer than {timeout_s:g} s and was cancelled") from None
        except Exception as exc:  # noqa: BLE001 - the protocol's error or a dead connection
            from mcp import MCPError
            if isinstance(exc, MCPError) and "closed" not in str(exc).lower():
                return ToolOutput(f"error: {failure_words(exc)}", is_error=True)
            conn.fail(f"the server stopped ({failure_words(exc)})")
            raise ServerUnavailable(f"the MCP server {server!r} stopped: {failure_words(exc)}") from None
        text = content_text(result.content)
        if not text and result.structured_content is not None:
            text = json.dumps(result.structured_content)
        return ToolOutput(text, is_error=bool(result.is_error))

    async def _client(self, server: str) -> Any:
        await self._start([server], retry=False)
        conn = self._connections.get(server)
        if conn is None or conn.client is None:
            raise ServerUnavailable(f"the MCP server {server!r} is unavailable"
                                    + (f": {conn.state.error}" if conn is not None and conn.state.error else ""))
        return conn.client

    async def _prompt(self, server: str, name: str, arguments: dict[str, str]) -> list[dict]:
        result = await (await self._client(server)).get_prompt(name, arguments)
        return [{"role": m.role, "content": content_text([m.content])} for m in result.messages]

    async def _resource(self, server: str, uri: str) -> str:
        result = await (await self._client(server)).read_resource(uri)
        return "\n".join(getattr(c, "text", f"[binary {c.mime_type or ''}]") for c in result.contents)

    async def _close(self) -> None:
        tasks = [c.task for c in self._connections.values() if c.task is not None]
        for conn in self._connections.values():
            conn.stop()
        if tasks:
            await asyncio.wait(tasks, timeout=10)

    # -- any thread ---------------------------------------------------------------------------------
    def configure(self, servers: dict[str, ServerConfig]) -> None:
        """Take a new configuration: changed or removed servers stop; new ones start when needed."""
        self._run(self._configure(dict(servers)))

    def states(self) -> dict[str, ServerState]:
        return {name: conn.state for name, conn in list(self._connections.items())}

    def start(self, names: Iterable[str], retry: bool = False) -> dict[str, ServerState]:
        """Start these servers if they are not running, and wait until each is ready or has failed.
        A failed server stays failed (its tools absent, its reason shown) until `retry`: the user's
        Start in Settings -> Tools, not every message of a chat, restarts a server that crashed."""
        names = list(names)
        self._run(self._start(names, retry))
        states = self.states()
        return {n: states[n] for n in names if n in states}

    def call_tool(self, server: str, tool: str, arguments: dict, timeout_s: float,
                  cancelled: threading.Event | None = None) -> ToolOutput:
        """Call a tool; ToolTimeout past `timeout_s`, ServerUnavailable when the server is gone.
        Setting `cancelled` (the user's Stop) cancels the call on the server's side too."""
        future = asyncio.run_coroutine_threadsafe(self._call(server, tool, arguments, timeout_s), self._loop)
        while True:
            try:
                return future.result(0.1)
            except TimeoutError:
                if future.done():
                    raise
                if cancelled is not None and cancelled.is_set():
                    future.cancel()
                    raise ToolTimeout("cancelled by the user") from None

    def get_prompt(self, server: str, name: str, arguments: dict[str, str]) -> list[dict]:
        """An MCP prompt's messages ({"role", "content"}), for a `/name` command in the message box."""
        return self._run(self._prompt(server, name, arguments), self.start_timeout_s + 30)

    def read_resource(self, server: str, uri: str) -> str:
        return self._run(self._resource(server, uri), self.start_timeout_s + 30)

    def close(self) -> None:
        """Stop every server (their processes end) and the loop."""
        if not self._thread.is_alive():
            return
        try:
            self._run(self._close(), 15)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
