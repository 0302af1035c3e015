"""The app's MCP servers and each chat's choice of them: the one object the window hands to its chat
views and settings. Qt-free; its blocking calls (starting servers) belong on a worker thread.

A chat's settings say which servers are on (`mcp_servers`, default none: a small model given tools it
was not asked to use tends to call them) and which of their tools are off (`mcp_tools_off`, "server/tool").
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.agent.loop import AgentConfig
from app.agent.mcp_config import FILE_NAME, McpConfigError, ServerConfig, load_config, save_config
from app.agent.mcp_connection import PromptInfo, ResourceInfo, ServerState, ServerStatus, ToolInfo
from app.agent.mcp_host import McpHost
from app.agent.toolbox import Toolbox

SERVERS_KEY, TOOLS_OFF_KEY = "mcp_servers", "mcp_tools_off"


def config_path(settings: Any) -> Path:
    """mcp.json beside the settings file."""
    return Path(settings.path).parent / FILE_NAME


class ChatTools:
    def __init__(self, path: Path, on_change: Callable[[ServerState], None] | None = None) -> None:
        self.path = Path(path)
        self.error = ""  # why mcp.json could not be read, shown in Settings -> Tools
        self.servers: dict[str, ServerConfig] = {}
        self.host = McpHost({}, on_change=on_change)
        self.reload()

    def reload(self) -> bool:
        """Read mcp.json again (the user edited it by hand) and apply it; False, with `error` saying
        why, when it cannot be read (the servers running stay as they were)."""
        try:
            servers = load_config(self.path)
        except McpConfigError as exc:
            self.error = str(exc)
            return False
        self.servers, self.error = servers, ""
        self.host.configure(servers)
        return True

    def save(self, servers: dict[str, ServerConfig]) -> None:
        """Write mcp.json and apply it: changed or removed servers stop, new ones start when needed."""
        save_config(self.path, servers)
        self.servers, self.error = dict(servers), ""
        self.host.configure(self.servers)

    def states(self) -> dict[str, ServerState]:
        return self.host.states()

    @staticmethod
    def chat_servers(chat_settings: dict) -> list[str]:
        return list(chat_settings.get(SERVERS_KEY) or [])

    def enabled_for(self, chat_settings: dict) -> list[str]:
        """The chat's servers that are configured and not disabled."""
        return [n for n in self.chat_servers(chat_settings) if n in self.servers and not self.servers[n].disabled]

    def toolbox_for(self, chat_settings: dict) -> tuple[Toolbox, dict[str, ServerState]]:
        """Start the chat's servers (blocking) and name their tools that are on; with the states, so the
        caller can say which servers failed and why."""
        states = self.host.start(self.enabled_for(chat_settings))
        return _toolbox(chat_settings, states.values()), states

    def known_toolbox(self, chat_settings: dict) -> Toolbox | None:
        """The tools the chat's next turn will offer, when each of its servers has started already
        (ready, or failed: a turn does not retry one); None while one has not, since a server's tools
        are known only once it runs. Starts nothing: the window warms a chat's prompt with them."""
        states, names = self.host.states(), self.enabled_for(chat_settings)
        if any(n not in states or states[n].status not in (ServerStatus.READY, ServerStatus.FAILED) for n in names):
            return None
        return _toolbox(chat_settings, [states[n] for n in names])

    def prompts_for(self, chat_settings: dict) -> list[PromptInfo]:
        """The `/name` commands of the chat's servers that are running (none are started for this)."""
        states = self.host.states()
        return [p for n in self.enabled_for(chat_settings) if n in states for p in states[n].prompts]

    def resources_for(self, chat_settings: dict) -> list[ResourceInfo]:
        states = self.host.states()
        return [r for n in self.enabled_for(chat_settings) if n in states for r in states[n].resources]

    def always_allowed(self) -> set[tuple[str, str]]:
        return {(n, t) for n, s in self.servers.items() for t in s.auto_approve}

    def allow_always(self, server: str, tool: str) -> None:
        """"Always for this tool": kept in mcp.json's `autoApprove`, as Cline writes it."""
        cfg = self.servers.get(server)
        if cfg is None or tool in cfg.auto_approve:
            return
        self.servers[server] = replace(cfg, auto_approve=(*cfg.auto_approve, tool))
        save_config(self.path, self.servers)

    @staticmethod
    def agent_config(settings: Any) -> AgentConfig:
        return AgentConfig(step_limit=settings.tool_step_limit, call_timeout_s=settings.tool_timeout_s)

    def close(self) -> None:
        self.host.close()


def _toolbox(chat_settings: dict, states: Iterable[ServerState]) -> Toolbox:
    """The servers' tools that the chat has not turned off."""
    off = set(chat_settings.get(TOOLS_OFF_KEY) or [])
    tools: list[ToolInfo] = [t for s in states for t in s.tools if f"{t.server}/{t.name}" not in off]
    return Toolbox.of(tools)
