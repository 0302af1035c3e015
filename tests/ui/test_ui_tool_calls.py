"""Tool calls reach the window as data: the server parses them (both runners), the client's stream
carries them on its ChatDelta (OpenAI's streamed `tool_calls`, fragments joined), the chat store
keeps them, and the transcript (real widget, offscreen) shows a collapsed line per call with its
name and arguments in brief, opened to the arguments as JSON by its link. The transcript no longer
parses a reply's text for a call's syntax: text is shown as the model wrote it."""
from __future__ import annotations

import json

import pytest

from app.client import EngineClient
from app.history import ChatStore
from scripted_gguf import THINKING_SCRIPT, THINKING_TOOLS_TEMPLATE, write_scripted_model
from server_util import start_engine
from test_ui_messages import click_link
from ui.transcript import TranscriptView
from ui.transcript_message import TranscriptMessage, from_history

WEATHER = ("get_weather", '{"city": "Paris", "unit": "celsius"}')
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
    "required": ["city"], "additionalProperties": False}}}]


def view_of(qtbot, reply: TranscriptMessage) -> TranscriptView:
    view = TranscriptView()
    qtbot.addWidget(view)
    view.set_messages([TranscriptMessage("user", "What is the weather in Paris?"), reply])
    return view


def test_a_call_is_a_collapsed_line_that_opens(qtbot):
    view = view_of(qtbot, TranscriptMessage("assistant", "I will look it up.", tool_calls=[WEATHER]))
    text = view.plain_text()
    assert "I will look it up." in text
    assert 'Tool call get_weather(city="Paris", unit="celsius")' in text and '"unit": "celsius"' not in text
    view.resize(900, 600)  # one line per tool call: a link is clicked in its middle
    view.show()
    click_link(qtbot, view, "arguments")  # the line's link, with the mouse
    assert '"unit": "celsius"' in view.plain_text()
    click_link(qtbot, view, "hide arguments")
    assert '"unit": "celsius"' not in view.plain_text()


def test_a_calls_syntax_in_text_is_text(qtbot):
    raw = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    view = view_of(qtbot, TranscriptMessage("assistant", raw))
    assert "Tool call" not in view.plain_text() and "<tool_call>" in view.plain_text()


def test_calls_are_stored_with_the_reply(tmp_path, qtbot):
    store = ChatStore(tmp_path / "chats.sqlite3")
    chat = store.create_chat("t")
    store.add_message(chat, "user", "weather?")
    reply = store.add_message(chat, "assistant", "")
    store.update_message(reply, "", "done", tool_calls=[WEATHER], finish_reason="tool_calls")
    (_, shown) = from_history(store.messages(chat), None)
    assert shown.tool_calls == [WEATHER]
    assert "Tool call get_weather" in view_of(qtbot, shown).plain_text()
    store.close()


@pytest.mark.parametrize("backend", ["torch", "llama.cpp"])
def test_the_stream_carries_the_servers_calls_as_data(tmp_path, backend):
    model = write_scripted_model(tmp_path / "tools.gguf", THINKING_SCRIPT, template=THINKING_TOOLS_TEMPLATE)
    proc = start_engine(model, tmp_path, backend=backend)
    try:
        client = EngineClient(proc.base_url, api_key=proc.api_key)
        deltas = list(client.chat_stream([{"role": "user", "content": "Say ok."}], temperature=0, max_tokens=200,
                                         tools=TOOLS, tool_choice="required"))
        calls = [d.tool_calls for d in deltas if d.tool_calls][-1]
        (call,) = calls
        assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Oslo") and call.id
        assert deltas[-1].finish_reason == "tool_calls" or any(d.finish_reason == "tool_calls" for d in deltas)
        assert "<tool_call>" not in "".join(d.text for d in deltas)
        whole = client.chat([{"role": "user", "content": "Say ok."}], temperature=0, max_tokens=200, tools=TOOLS,
                            tool_choice="required")
        assert [(c.name, c.arguments) for c in whole.tool_calls] == [(call.name, call.arguments)]
    finally:
        proc.stop()
