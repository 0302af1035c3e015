"""mcp.json in the notation Claude Desktop, Cursor and Cline write; the chat's toolbox and argument checks."""
from __future__ import annotations

import json
import os
import stat

import pytest

from app.agent.mcp_config import (McpConfigError, claude_desktop_config_path, load_config, merge_imported,
                                  parse_config, save_config)
from app.agent.mcp_connection import ToolInfo
from app.agent.toolbox import Toolbox, check_arguments, cut_result

CLAUDE = {"mcpServers": {
    "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
              "env": {"TOKEN": "k"}},
    "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"}},
    "cline": {"command": "uvx", "args": ["mcp-server-time"], "disabled": True, "autoApprove": ["now"],
              "timeout": 30},
}}


def test_claude_desktop_and_cline_notation_round_trips(tmp_path):
    servers = parse_config(CLAUDE)
    assert servers["files"].transport == "stdio" and servers["files"].env == {"TOKEN": "k"}
    assert servers["remote"].transport == "http" and servers["remote"].headers["Authorization"] == "Bearer x"
    assert servers["cline"].disabled and servers["cline"].auto_approve == ("now",)
    path = tmp_path / "cfg" / "mcp.json"
    save_config(path, servers)
    assert json.loads(path.read_text()) == CLAUDE  # other apps' keys ("timeout") kept as they were
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # env and headers can hold keys
    assert load_config(path) == servers


@pytest.mark.parametrize("entry, words", [
    ({"args": ["x"]}, "either a \"command\""),
    ({"command": "a", "url": "http://x"}, "either a \"command\""),
    ({"url": "ftp://x"}, "http:// or https://"),
    ({"command": "a", "args": "not a list"}, "\"args\" must be a list"),
    ({"command": "a", "env": {"K": 1}}, "env must be an object of strings"),
])
def test_a_bad_entry_is_named_with_the_problem(entry, words):
    with pytest.raises(McpConfigError, match="server 'bad'") as err:
        parse_config({"mcpServers": {"bad": entry}})
    assert words in str(err.value)


def test_a_broken_file_says_where_and_a_missing_one_is_empty(tmp_path):
    assert load_config(tmp_path / "none.json") == {}
    broken = tmp_path / "mcp.json"
    broken.write_text('{"mcpServers": {"a": ')
    with pytest.raises(McpConfigError, match="not valid JSON"):
        load_config(broken)


def test_importing_claude_desktop_keeps_the_users_own_entries(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    path = claude_desktop_config_path()
    assert str(path).startswith(str(tmp_path)) and path.name == "claude_desktop_config.json"
    mine = parse_config({"mcpServers": {"files": {"command": "my-own"}}})
    merged, added = merge_imported(mine, parse_config(CLAUDE))
    assert added == ["remote", "cline"] and merged["files"].command == "my-own"


def _tool(server, name, schema=None):
    return ToolInfo(server, name, f"{name} of {server}", schema or {"type": "object"})


def test_tool_names_two_servers_share_are_prefixed_by_server():
    box = Toolbox.of([_tool("a", "lookup"), _tool("b", "lookup"), _tool("a", "add"), _tool("b", "odd name")])
    assert set(box.tools) == {"a__lookup", "b__lookup", "add", "b__odd_name"}
    assert box.find("b__lookup").server == "b"
    sent = box.openai_tools()
    assert {t["function"]["name"] for t in sent} == set(box.tools)
    assert all(t["type"] == "function" and t["function"]["parameters"]["type"] == "object" for t in sent)


def test_arguments_are_checked_against_the_tools_schema():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "required": ["a", "b"]}
    tool = _tool("s", "add", schema)
    assert check_arguments(tool, '{"a": 1, "b": 2}') == ({"a": 1, "b": 2}, None)
    assert "not valid JSON" in check_arguments(tool, '{"a": 1,')[1]
    assert "JSON object" in check_arguments(tool, "[1, 2]")[1]
    assert "'b' is a required property" in check_arguments(tool, '{"a": 1}')[1]
    value, why = check_arguments(tool, '{"a": "one", "b": 2}')
    assert value is None and "at a" in why and "not of type 'integer'" in why


def test_a_long_result_is_cut_with_a_note():
    text, cut = cut_result("x" * 5000, 1000)
    assert cut and text.startswith("x" * 900) and "5,000 characters" in text and len(text) <= 1000
    assert cut_result("short", 1000) == ("short", False)
