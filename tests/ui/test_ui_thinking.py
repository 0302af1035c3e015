"""A reasoning model's thinking in the chat window (offscreen, a real engine on the scripted
thinking model of tests/scripted_gguf.py): the reply shows its thoughts apart from the answer,
collapsed to "Thought for N s" that a click opens; the chat store keeps them in their own field,
a reopened chat shows them again, the export quotes them and the next turn does not send them.
"""
from __future__ import annotations

import sqlite3

import pytest

from app.gui_main import build_app
from app.history import ChatStore
from app.supervisor import SupervisorState
from scripted_gguf import THINKING_SCRIPT, write_scripted_model
from test_ui_messages import click_link
from ui_support import make_settings, start_engine

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def app(qtbot, tmp_path):
    settings = make_settings(tmp_path / "app")
    sup = start_engine(settings, write_scripted_model(tmp_path / "thinker.gguf", THINKING_SCRIPT))
    ember = build_app(settings, supervisor=sup, poll_interval_ms=200)
    qtbot.addWidget(ember.window)
    ember.window.show()
    ember.controller.start()
    qtbot.waitUntil(lambda: ember.controller.state == SupervisorState.READY, timeout=30_000)
    yield ember
    for view in list(ember.window._views.values()):
        view.stop()
    ember.controller.close()
    ember.chat_store.close()
    sup.stop()


def record_requests(app, monkeypatch) -> list[tuple[list[dict], dict]]:
    """(messages, request keywords) of every chat the app sends from now on."""
    recorded: list[tuple[list[dict], dict]] = []
    cls = type(app.controller.client())
    original = cls.chat_stream
    monkeypatch.setattr(cls, "chat_stream", lambda self, messages, *a, **kw: (
        recorded.append((messages, kw)), original(self, messages, *a, **kw))[1])
    return recorded


def test_thoughts_collapse_above_the_answer_and_survive_a_restart(qtbot, app, monkeypatch):
    view = app.window.new_chat()
    app.chat_store.update_chat_settings(view.chat_id, {"temperature": 0.0, "max_tokens": 32})
    recorded = record_requests(app, monkeypatch)
    with qtbot.waitSignal(view.reply_finished, timeout=120_000):
        view.send("Say ok.")
    with qtbot.waitSignal(view.reply_finished, timeout=120_000):
        view.send("Again.")
    reply = view.transcript.messages[1]
    assert (reply.content, reply.reasoning) == ("ok", "hm") and reply.thought_s is not None
    shown = view.transcript.toPlainText()
    assert "Thought for" in shown and "hm" not in shown.split("Thought for")[1].split("ok")[0]
    click_link(qtbot, view.transcript, "show")
    assert "hm" in view.transcript.toPlainText()
    # the second turn sent the first answer without its thoughts
    assert recorded[1][0][-2] == {"role": "assistant", "content": "ok"}

    stored = app.chat_store.messages(view.chat_id)[1]
    assert (stored.content, stored.reasoning) == ("ok", "hm") and stored.thought_s is not None
    assert "> _Thought for" in app.chat_store.export_markdown(view.chat_id)
    again = build_app(app.settings, supervisor=app.controller.supervisor)
    qtbot.addWidget(again.window)
    reopened = again.window.open_chat(view.chat_id).transcript
    assert reopened.messages[1].reasoning == "hm" and "Thought for" in reopened.toPlainText()
    again.chat_store.close()


def test_a_history_file_from_before_gains_the_reasoning_fields(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE chats (id INTEGER PRIMARY KEY, title TEXT NOT NULL, model TEXT,
            settings TEXT NOT NULL DEFAULT '{}', created_at REAL NOT NULL, updated_at REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY, chat_id INTEGER NOT NULL, role TEXT NOT NULL,
            content TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'done', created_at REAL NOT NULL, tok_s REAL,
            ttft REAL);
        INSERT INTO chats VALUES (1, 'old', NULL, '{}', 0, 0);
        INSERT INTO messages VALUES (1, 1, 'user', 'hi', 'done', 0, NULL, NULL);
        PRAGMA user_version=1;
    """)
    db.close()
    store = ChatStore(path)
    try:
        (m,) = store.messages(1)
        assert (m.content, m.reasoning, m.thought_s) == ("hi", "", None)
        store.update_message(1, reasoning="why", thought_s=1.5)
        assert store.get_message(1).reasoning == "why"
    finally:
        store.close()


def test_the_think_switch_shows_for_a_model_that_has_one_and_reaches_the_template(qtbot, app, monkeypatch):
    panel = app.window.settings_panel
    qtbot.waitUntil(lambda: panel.think.isVisibleTo(app.window), timeout=30_000)
    assert app.controller.last_status["thinking"] == {"format": "think_tags", "switch": True, "effort": False}
    assert not panel.effort.isVisibleTo(app.window)  # its template takes no reasoning_effort
    view = app.window.new_chat()
    app.chat_store.update_chat_settings(view.chat_id, {"temperature": 0.0, "max_tokens": 32})
    recorded = record_requests(app, monkeypatch)
    panel.think.setChecked(False)  # as a click does: the chat's setting, then its next request
    assert app.chat_store.get_chat(view.chat_id).settings["think"] is False
    with qtbot.waitSignal(view.reply_finished, timeout=120_000):
        view.send("Say ok.")
    assert recorded[-1][1]["chat_template_kwargs"] == {"enable_thinking": False}


def test_the_effort_choice_shows_for_a_template_that_takes_one_and_reaches_it(qtbot, tmp_path, monkeypatch):
    """gpt-oss's template takes reasoning_effort: the panel offers it (and no think switch), the
    chat keeps the choice, and its requests carry it to the template."""
    from scripted_gguf import HARMONY_TEMPLATE

    template = HARMONY_TEMPLATE.replace("{% if add_generation_prompt %}",
                                        "{% if add_generation_prompt %}{{ 'Reasoning: ' + (reasoning_effort or "
                                        "'medium') }}")
    script = ["h", "m", "<|end|>", "<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "o", "k",
              "<|return|>"]
    settings = make_settings(tmp_path / "app")
    sup = start_engine(settings, write_scripted_model(tmp_path / "oss.gguf", script, template=template, harmony=True))
    ember = build_app(settings, supervisor=sup, poll_interval_ms=200)
    try:
        qtbot.addWidget(ember.window)
        ember.window.show()
        ember.controller.start()
        panel = ember.window.settings_panel
        qtbot.waitUntil(lambda: panel.effort.isVisibleTo(ember.window), timeout=60_000)
        assert ember.controller.last_status["thinking"] == {"format": "harmony", "switch": False, "effort": True}
        assert not panel.think.isVisibleTo(ember.window)
        view = ember.window.new_chat()
        recorded = record_requests(ember, monkeypatch)
        panel.effort.setCurrentIndex(panel.effort.findData("high"))  # as a pick does: the chat's setting
        chosen = ember.chat_store.get_chat(view.chat_id).settings
        assert chosen["effort"] == "high"
        ember.chat_store.update_chat_settings(view.chat_id, chosen | {"temperature": 0.0, "max_tokens": 32})
        errors = []
        view._on_error = (lambda orig: lambda e: (errors.append(e), orig(e)))(view._on_error)
        with qtbot.waitSignal(view.reply_finished, timeout=120_000):
            view.send("Say ok.")
        assert not errors, errors
        assert recorded[-1][1]["reasoning_effort"] == "high"
        last = ember.chat_store.messages(view.chat_id)[-1]
        assert (last.reasoning, last.content) == ("hm", "ok"), last
    finally:
        for v in list(ember.window._views.values()):
            v.stop()
        ember.controller.close()
        ember.chat_store.close()
        sup.stop()


def test_a_reply_that_thought_through_its_budget_says_so_and_continues(qtbot, app):
    view = app.window.new_chat()
    app.chat_store.update_chat_settings(view.chat_id, {"temperature": 0.0, "max_tokens": 3})
    with qtbot.waitSignal(view.reply_finished, timeout=120_000):
        view.send("Say ok.")
    reply = view.transcript.messages[-1]
    assert (reply.content, reply.reasoning, reply.finish_reason) == ("", "h", "length") and reply.out_of_budget
    shown = view.transcript.toPlainText()
    assert "whole token budget thinking" in shown and "Copy thoughts" in shown
    app.chat_store.update_chat_settings(view.chat_id, {"temperature": 0.0, "max_tokens": 32})
    with qtbot.waitSignal(view.reply_finished, timeout=120_000) as done:
        click_link(qtbot, view.transcript, "Continue", nth=1)  # the first is the notice's word
    assert done.args == [view.chat_id, "done"], reply.error
    assert view.transcript.messages[-1] is reply and (reply.content, reply.reasoning) == ("ok", "hm")
    assert "budget" not in view.transcript.toPlainText() and "Continue" not in view.transcript.toPlainText()
    stored = app.chat_store.messages(view.chat_id)[-1]
    assert (stored.content, stored.reasoning, stored.finish_reason) == ("ok", "hm", "stop")
    assert len(app.chat_store.messages(view.chat_id)) == 2  # the same reply, not a new one
