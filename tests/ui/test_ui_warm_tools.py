"""A chat with MCP tools on is warmed too (ui/chat_warm.py), once its servers run: their tools'
definitions are part of the prompt, known only then. The whole app on a real engine serving a
scripted model whose template renders tools (tests/scripted_gguf.py), a real stdio MCP server."""
from __future__ import annotations

import json
from contextlib import closing

import pytest

from app.agent.chat_tools import config_path
from mcp_util import stdio_server_entry
from scripted_gguf import TOOL_ANSWER, write_tool_model
from ui_support import app_on, make_settings, start_engine

pytestmark = pytest.mark.timeout(300)
BLOCK = 16  # the engine's block size: the warm's last partial block is computed again by the turn


@pytest.fixture(scope="module")
def tool_engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("warm-tools")
    sup = start_engine(make_settings(root / "engine"), write_tool_model(root / "answers.gguf", None))
    yield sup
    sup.stop()


def test_a_chat_with_tools_is_warmed_with_them_once_its_servers_run(qtbot, tmp_path, tool_engine):
    """Before its server runs the chat is not warmed (nor marked as warmed); shown again after, it is,
    with the tools its next turn offers (those it turned off left out), and that turn's prompt then
    comes from the cache."""
    settings = make_settings(tmp_path / "app")
    config_path(settings).parent.mkdir(parents=True, exist_ok=True)
    config_path(settings).write_text(json.dumps({"mcpServers": {"demo": stdio_server_entry()}}))
    with app_on(qtbot, settings, tool_engine) as ember, closing(ember.chat_tools):  # its server's process ends
        store, window, tools, warmer = ember.chat_store, ember.window, ember.chat_tools, ember.window.warmer
        talk = [("user", "Tell me about harbours. " * 8), ("assistant", "Ships rest there in storms. " * 4)]
        plain = {"temperature": 0.0, "max_tokens": 8}
        on = {**plain, "mcp_servers": ["demo"], "mcp_tools_off": ["demo/add"]}
        chat_id, without = store.create_chat("Harbours, tools", settings=on), store.create_chat("Harbours", settings=plain)
        for chat, (role, text) in ((c, m) for c in (chat_id, without) for m in talk):
            store.add_message(chat, role, text)
        window.chat_list.refresh()
        qtbot.waitUntil(lambda: ember.controller.state == "ready", timeout=60_000)
        with qtbot.waitSignal(warmer.warmed, timeout=120_000) as warmed_plain:
            window.open_chat(without)

        view = window.open_chat(chat_id)  # its server has not started: what the turn offers is not known yet
        assert tools.known_toolbox(on) is None and warmer.warm_current() is None and chat_id not in warmer._warmed
        tools.host.start(["demo"])  # as the chat's first turn, or ticking it in the chat's panel, starts it
        names = [t["function"]["name"] for t in tools.known_toolbox(on).openai_tools()]
        assert names and not any(n.endswith("add") for n in names)  # the chat turned `add` off
        window.open_chat(without)
        with qtbot.waitSignal(warmer.warmed, timeout=120_000) as warmed:
            window.open_chat(chat_id)  # shown again: warmed, with the tools
        assert warmed.args[0] == chat_id
        assert warmed.args[1]["prompt_tokens"] > warmed_plain.args[1]["prompt_tokens"]  # the definitions are in it

        with qtbot.waitSignal(view.reply_finished, timeout=120_000) as done:
            view.send("And in a storm?")
        assert done.args == [chat_id, "done"], view.transcript.messages[-1].error
        assert view.transcript.messages[-1].content == TOOL_ANSWER
        full = warmed.args[1]["prompt_tokens"] // BLOCK * BLOCK
        assert window.status.cached_label.text().startswith(f"cached {full:,} of ")
