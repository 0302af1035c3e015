"""One MCP server's connection, on the host's event loop: start (a process or a URL), list what it offers,
serve calls until stopped, and say why when it fails. The official SDK speaks the protocol."""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Callable

from app.agent.mcp_config import ServerConfig

log = logging.getLogger("app.agent.mcp")


class ServerStatus(StrEnum):
    STOPPED = "stopped"    # configured, not started yet (a server starts when a chat needs it)
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    DISABLED = "disabled"


@dataclass(frozen=True, slots=True)
class ToolInfo:
    server: str
    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PromptInfo:
    server: str
    name: str
    description: str
    arguments: tuple[tuple[str, bool], ...]  # (name, required)


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    server: str
    uri: str
    name: str
    mime_type: str | None


@dataclass(frozen=True, slots=True)
class ServerState:
    name: str
    status: ServerStatus
    tools: tuple[ToolInfo, ...] = ()
    prompts: tuple[PromptInfo, ...] = ()
    resources: tuple[ResourceInfo, ...] = ()
    error: str = ""

    def describe(self) -> str:
        """The state in words, as the settings list shows it."""
        if self.status is ServerStatus.READY:
            return f"ready, {len(self.tools)} tool{'s' if len(self.tools) != 1 else ''}"
        if self.status is ServerStatus.FAILED:
            return f"failed: {self.error}"
        return self.status.value


class ServerUnavailable(RuntimeError):
    """The server is not running (it failed to start, or crashed); the message says why."""


def _stderr_pipe(name: str):
    """A file the server's stderr is written to, whose lines go to the app's log (a thread reads it)."""
    read_fd, write_fd = os.pipe()

    def pump() -> None:
        with os.fdopen(read_fd, "r", encoding="utf-8", errors="replace") as f:
            for line in f:
                log.info("[mcp %s] %s", name, line.rstrip())

    threading.Thread(target=pump, name=f"mcp-stderr-{name}", daemon=True).start()
    return os.fdopen(write_fd, "w", encoding="utf-8")


def _transport(cfg: ServerConfig, stack: AsyncExitStack):
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client

    if cfg.url:
        if cfg.headers:
            import httpx2
            client = httpx2.AsyncClient(headers=dict(cfg.headers), timeout=httpx2.Timeout(30.0, read=300.0))
            return streamable_http_client(cfg.url, http_client=client)
        return streamable_http_client(cfg.url)
    errlog = stack.enter_context(_stderr_pipe(cfg.name))
    params = StdioServerParameters(command=cfg.command or "", args=list(cfg.args), env=dict(cfg.env) or None)
    return stdio_client(params, errlog=errlog)


def failure_words(exc: BaseException) -> str:
    """The innermost reason of an exception (group), in a line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {exc.filename or exc}"
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


class Connection:
    """A server's life on the event loop. `state` is replaced (never mutated), so readers on other
    threads see a whole state; `on_change` is called with each new one."""

    def __init__(self, cfg: ServerConfig, on_change: Callable[[ServerState], None]) -> None:
        self.cfg, self._on_change = cfg, on_change
        self.state = ServerState(cfg.name, ServerStatus.DISABLED if cfg.disabled else ServerStatus.STOPPED)
        self.client: Any = None
        self.ready: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self.task: asyncio.Task | None = None

    def _set(self, **changes: Any) -> None:
        self.state = replace(self.state, **changes)
        self._on_change(self.state)

    def start(self) -> None:
        """Begin connecting (on the loop); `ready` is set once it is ready or has failed."""
        if self.task is not None and not self.task.done():
            return
        self.ready, self._stop = asyncio.Event(), asyncio.Event()
        self._set(status=ServerStatus.STARTING, error="")
        self.task = asyncio.get_running_loop().create_task(self._serve())

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def fail(self, reason: str) -> None:
        """A call found the server gone: say why, and let the task wind the connection down."""
        self.client = None
        self._set(status=ServerStatus.FAILED, error=reason, tools=(), prompts=(), resources=())
        self.stop()

    async def _serve(self) -> None:
        import mcp
        try:
            async with AsyncExitStack() as stack:
                client = await stack.enter_async_context(mcp.Client(_transport(self.cfg, stack)))
                tools, prompts, resources = await self._offers(client)
                self.client = client
                self._set(status=ServerStatus.READY, tools=tools, prompts=prompts, resources=resources)
                self.ready.set()
                await self._stop.wait()
                self.client = None
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - a server's failure is its state, never the app's
            log.warning("MCP server %s failed: %s", self.cfg.name, failure_words(exc))
            if self.state.status is not ServerStatus.FAILED:
                self._set(status=ServerStatus.FAILED, error=failure_words(exc), tools=(), prompts=(), resources=())
        else:
            if self.state.status is not ServerStatus.FAILED:
                self._set(status=ServerStatus.STOPPED, tools=(), prompts=(), resources=())
        finally:
            self.client = None
            self.ready.set()

    async def _offers(self, client: Any) -> tuple[tuple[ToolInfo, ...], tuple[PromptInfo, ...],
                                                 tuple[ResourceInfo, ...]]:
        name, caps = self.cfg.name, client.server_capabilities
        listed = await client.list_tools()
        tools = tuple(ToolInfo(name, t.name, t.description or "", dict(t.input_schema or {"type": "object"}))
                      for t in listed.tools)
        prompts: tuple[PromptInfo, ...] = ()
        resources: tuple[ResourceInfo, ...] = ()
        if caps.prompts is not None:
            prompts = tuple(PromptInfo(name, p.name, p.description or "",
                                       tuple((a.name, bool(a.required)) for a in p.arguments or ()))
                            for p in (await client.list_prompts()).prompts)
        if caps.resources is not None:
            resources = tuple(ResourceInfo(name, str(r.uri), r.name, r.mime_type)
                              for r in (await client.list_resources()).resources)
        return tools, prompts, resources
