"""The MCP host against real servers (the official SDK's, tests/mcp_test_server.py), over stdio and
Streamable HTTP: started when asked, calls, timeouts, a crash, a server that never starts, stderr in the log."""
from __future__ import annotations

import logging
import time

import psutil
import pytest

from app.agent.mcp_config import parse_config
from app.agent.mcp_connection import ServerStatus, ServerUnavailable
from app.agent.mcp_host import McpHost, ToolTimeout
from mcp_test_server import FAIL_LINE, NOTES_TEXT, READY_LINE, lookup_value
from mcp_util import http_server, stdio_server_entry


@pytest.fixture
def host():
    hosts = []

    def make(entries: dict) -> McpHost:
        hosts.append(McpHost(parse_config({"mcpServers": entries}), start_timeout_s=60))
        return hosts[-1]

    yield make
    for h in hosts:
        h.close()


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_a_stdio_server_starts_when_asked_serves_and_ends_with_the_host(host, caplog):
    caplog.set_level(logging.INFO, logger="app.agent.mcp")
    before = _children()
    h = host({"t": stdio_server_entry()})
    assert h.states()["t"].status is ServerStatus.STOPPED and _children() == before  # not before a chat needs it
    state = h.start(["t"])["t"]
    assert state.status is ServerStatus.READY, state.error
    assert {"lookup", "add", "sleep", "crash", "big", "fail"} <= {t.name for t in state.tools}
    assert state.describe().startswith("ready, ") and [p.name for p in state.prompts] == ["review"]
    assert h.call_tool("t", "lookup", {"key": "k"}, 30).text == lookup_value("k")
    assert h.call_tool("t", "add", {"a": 2, "b": 40}, 30).text == "42"
    failed = h.call_tool("t", "fail", {}, 30)
    assert failed.is_error and failed.text
    assert "review" in h.get_prompt("t", "review", {"topic": "the plan"})[0]["content"].lower()
    assert h.read_resource("t", "notes://today") == NOTES_TEXT
    started = _children() - before
    assert started
    h.close()
    assert not {pid for pid in started if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"}
    deadline = time.monotonic() + 10
    while READY_LINE not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f"[mcp t] {READY_LINE}" in caplog.text  # its stderr, in the app's log


def test_a_call_past_its_timeout_is_cancelled_and_the_server_goes_on(host):
    h = host({"t": stdio_server_entry()})
    h.start(["t"])
    with pytest.raises(ToolTimeout, match="longer than 0.5 s"):
        h.call_tool("t", "sleep", {"seconds": 30}, 0.5)
    assert h.call_tool("t", "lookup", {"key": "after"}, 30).text == lookup_value("after")


def test_a_crashed_server_is_unavailable_with_the_reason_and_others_go_on(host):
    h = host({"a": stdio_server_entry(MCP_TEST_NAME="a"), "b": stdio_server_entry(MCP_TEST_NAME="b")})
    h.start(["a", "b"])
    with pytest.raises(ServerUnavailable, match="'a'"):
        h.call_tool("a", "crash", {}, 30)
    state = h.states()["a"]
    assert state.status is ServerStatus.FAILED and state.error
    with pytest.raises(ServerUnavailable):
        h.call_tool("a", "lookup", {"key": "k"}, 30)
    assert h.call_tool("b", "lookup", {"key": "k"}, 30).text == lookup_value("k")


def test_servers_that_never_start_say_why(host, caplog):
    caplog.set_level(logging.INFO, logger="app.agent.mcp")
    h = host({"missing": {"command": "/nonexistent/mcp-server"},
              "refuses": stdio_server_entry(MCP_TEST_FAIL_START="1")})
    states = h.start(["missing", "refuses"])
    assert states["missing"].status is ServerStatus.FAILED
    assert "command not found" in states["missing"].describe()
    assert states["refuses"].status is ServerStatus.FAILED and states["refuses"].error
    deadline = time.monotonic() + 10
    while FAIL_LINE not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.05)
    assert FAIL_LINE in caplog.text  # why it refused is in the log


def test_a_streamable_http_server_with_headers(host):
    with http_server() as url:
        h = host({"web": {"url": url, "headers": {"X-Test": "1"}}})
        state = h.start(["web"])["web"]
        assert state.status is ServerStatus.READY, state.error
        assert h.call_tool("web", "lookup", {"key": "w"}, 30).text == lookup_value("w")
        h.close()
