"""Tool calls in a reply are shown readably in the transcript (real widget, offscreen): a
collapsed line per call with its name and arguments in brief, opened to the arguments as JSON by
its link; the raw syntax (<tool_call>, [TOOL_CALLS]) never shows."""
from __future__ import annotations

from test_ui_messages import click_link

from ui.transcript import TranscriptView
from ui.transcript_markdown import tool_calls
from ui.transcript_message import TranscriptMessage

HERMES = ('I will look it up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
          '\n</tool_call>')
MISTRAL = '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}]'


def view_of(qtbot, reply: str) -> TranscriptView:
    view = TranscriptView()
    qtbot.addWidget(view)
    view.set_messages([TranscriptMessage("user", "What is the weather in Paris?"),
                       TranscriptMessage("assistant", reply)])
    return view


def test_a_hermes_call_is_a_collapsed_line_that_opens(qtbot):
    view = view_of(qtbot, HERMES)
    text = view.plain_text()
    assert "I will look it up." in text and "<tool_call>" not in text
    assert 'Tool call get_weather(city="Paris", unit="celsius")' in text and '"unit": "celsius"' not in text
    view.resize(900, 600)  # one line per tool call: a link is clicked in its middle
    view.show()
    click_link(qtbot, view, "arguments")  # the line's link, with the mouse
    assert '"unit": "celsius"' in view.plain_text()
    click_link(qtbot, view, "hide arguments")
    assert '"unit": "celsius"' not in view.plain_text()


def test_a_mistral_call_and_plain_replies(qtbot):
    view = view_of(qtbot, MISTRAL)
    assert 'Tool call get_time(zone="Europe/Paris")' in view.plain_text() and "[TOOL_CALLS]" not in view.plain_text()
    assert tool_calls("Paris is sunny today.") == ("Paris is sunny today.", [])
    assert tool_calls('<tool_call>{"name": broken</tool_call>')[1] == []  # text that does not parse stays text
