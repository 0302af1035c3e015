"""MCP prompts as `/name` commands, and resources attached to a message, against the real test server."""
from __future__ import annotations

import pytest

from app.agent.chat_tools import ChatTools
from app.agent.mcp_config import parse_config, save_config
from app.agent.mcp_connection import PromptInfo
from app.agent.prompt_commands import PromptCommandError, parse_command, usage, with_resource
from mcp_test_server import NOTES_TEXT, NOTES_URI
from mcp_util import stdio_server_entry

REVIEW = PromptInfo("s", "review", "Review a topic", (("topic", True),))
TWO = PromptInfo("s", "compare", "", (("a", True), ("b", False)))


def test_commands_fill_the_prompts_arguments():
    assert parse_command("/review the new plan", [REVIEW]) == (REVIEW, {"topic": "the new plan"})
    assert parse_command("/review topic=plans", [REVIEW]) == (REVIEW, {"topic": "plans"})
    assert parse_command("/compare x y z", [TWO]) == (TWO, {"a": "x", "b": "y z"})
    assert parse_command("/compare a=1", [TWO]) == (TWO, {"a": "1"})
    assert parse_command("/unknown thing", [REVIEW]) is None  # sent as typed
    assert parse_command("hello /review", [REVIEW]) is None and parse_command("//review x", [REVIEW]) is None
    with pytest.raises(PromptCommandError, match=r"needs topic: /review topic=…"):
        parse_command("/review", [REVIEW])
    assert usage(TWO) == "/compare a=… [b=…]"


def test_a_resource_is_attached_in_a_fence_it_cannot_close():
    text = with_resource("Summarise this.", "notes://x", "a ``` b")
    assert text == "Summarise this.\n\n[resource notes://x]\n````\na ``` b\n````"


def test_a_chats_servers_offer_their_prompts_and_resources(tmp_path):
    path = tmp_path / "mcp.json"
    save_config(path, parse_config({"mcpServers": {"t": stdio_server_entry(), "off": stdio_server_entry()}}))
    tools = ChatTools(path)
    try:
        chat = {"mcp_servers": ["t"]}
        assert tools.prompts_for(chat) == []  # nothing runs before the chat needs it
        box, states = tools.toolbox_for(chat)
        assert set(states) == {"t"} and box.find("lookup").server == "t"
        (prompt,) = tools.prompts_for(chat)
        _, args = parse_command("/review the plan", [prompt])
        (message,) = tools.host.get_prompt("t", prompt.name, args)
        assert message["role"] == "user" and "the plan" in message["content"]
        (resource,) = tools.resources_for(chat)
        assert resource.uri == NOTES_URI and tools.host.read_resource("t", resource.uri) == NOTES_TEXT
    finally:
        tools.close()
