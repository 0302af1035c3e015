"""The window's second pass, widget by widget (offscreen, real SQLite, no engine): deleting one
message, a reply that thought through its whole budget, the speculative box that shows what the
engine does, a chat list that keeps its order under the pointer, the loaded model marked in the
model manager, and failures in words instead of an API's."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from app.client import EngineClientError
from app.history import ChatStore
from app.store import ModelStore
from ui.chat_list import ChatListPanel
from ui.chat_settings_panel import ChatSettingsPanel
from ui.error_words import load_failure_words, reply_error_text
from ui.installed_table import InstalledTable
from ui.message_actions import MessageActions
from ui.transcript import TranscriptView
from ui.transcript_message import TranscriptMessage, from_history
from ui_support import make_settings


@pytest.fixture
def chat(qtbot, tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    chat_id = store.create_chat("t")
    view = TranscriptView()
    qtbot.addWidget(view)
    actions = MessageActions(view, store, None, lambda: False, lambda: None)
    view.action_requested.connect(actions.run)
    yield store, chat_id, view, actions
    store.close()


def test_delete_removes_one_message_from_the_chat_and_its_store(chat):
    store, chat_id, view, actions = chat
    for role, text in [("user", "one"), ("assistant", "two"), ("user", "three"), ("assistant", "four")]:
        store.add_message(chat_id, role, text)
    view.set_messages(from_history(store.messages(chat_id), None))
    assert view.toPlainText().count("Delete") == 4
    actions.run("delete", 1)
    assert [m.content for m in view.messages] == ["one", "three", "four"]
    assert [m.content for m in store.messages(chat_id)] == ["one", "three", "four"]
    assert "two" not in view.toPlainText().split("\n")


def test_a_reply_that_only_thought_says_so_and_offers_its_thoughts(chat):
    store, chat_id, view, actions = chat
    reply = TranscriptMessage("assistant", "", reasoning="Let me think about primes.\nSeven is", thought_s=36.0,
                              finish_reason="length")
    view.set_messages([TranscriptMessage("user", "Is 7 prime?"), reply])
    text = view.toPlainText()
    assert "whole token budget thinking" in text and "Copy thoughts" in text and "Continue" in text
    actions.run("copy", 1)
    assert QGuiApplication.clipboard().text() == reply.reasoning
    answered = TranscriptMessage("assistant", "Yes.", reasoning="Seven has no divisors.", thought_s=2.0,
                                 finish_reason="stop")
    view.set_messages([TranscriptMessage("user", "Is 7 prime?"), answered])
    assert "budget" not in view.toPlainText() and "Continue" not in view.toPlainText()
    # stored without its finish reason (after a restart): thoughts and no answer still read as out of budget
    store.add_message(chat_id, "user", "q")
    kept = store.add_message(chat_id, "assistant", "")
    store.update_message(kept, "", "done", reasoning="hmm", thought_s=1.0)
    assert from_history(store.messages(chat_id), None)[-1].out_of_budget


def test_speculative_box_shows_the_engine_and_keeps_the_chats_choice(qtbot):
    panel = ChatSettingsPanel()
    qtbot.addWidget(panel)
    panel.load({"speculative": True}, None)
    panel.set_speculation_available(False)  # Settings → Engine: off
    assert not panel.speculative.isChecked() and not panel.speculative.isEnabled()
    assert "off for the engine" in panel.speculative.toolTip()
    assert panel.values()["speculative"] is True  # the chat's own choice is not lost
    panel.set_speculation_available(True)
    assert panel.speculative.isChecked()
    with qtbot.waitSignal(panel.settings_changed) as edited:
        panel.speculative.setChecked(False)
    assert edited.args[0]["speculative"] is False
    panel.set_speculation_available(False)
    panel.set_speculation_available(True)
    assert not panel.speculative.isChecked()


def test_chat_list_keeps_its_order_while_chats_reply(qtbot, tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    panel = ChatListPanel(store)
    qtbot.addWidget(panel)
    a, b, c = panel.new_chat(), panel.new_chat(), panel.new_chat()

    def order():
        return [panel.list.item(i).data(Qt.UserRole) for i in range(panel.list.count())]

    before = order()
    assert before == [c, b, a]
    store.add_message(a, "user", "hello")  # the oldest chat gets a message and a reply
    store.rename_chat(a, "Hello")
    panel.set_streaming(a, True)
    panel.update_title(a)
    assert order() == before and panel.list.item(2).text() == "● Hello"
    panel.set_streaming(a, False)
    assert order() == before and panel.list.item(2).text() == "Hello"
    store.close()


def test_the_installed_tab_marks_the_loaded_model(qtbot, tmp_path, tiny_model_factory):
    store = ModelStore(tmp_path / "models")
    store.import_path(tiny_model_factory(), model_id="tiny")
    table = InstalledTable(store, make_settings(tmp_path / "ember"))
    qtbot.addWidget(table)
    status = table.table.columnCount() - 1
    assert table.table.item(0, status).text() == ""
    table.set_loaded("tiny")
    assert table.table.item(0, status).text() == "● loaded" and table.table.item(0, 0).font().bold()
    table.set_loaded(None)
    assert table.table.item(0, status).text() == "" and not table.table.item(0, 0).font().bold()


def test_failures_in_words_not_the_apis():
    not_loaded = EngineClientError("no model is loaded (x); POST /v1/engine/load first", 503,
                                   code="model_not_loaded")
    assert "POST" not in reply_error_text(not_loaded, remote=False)
    assert "model picker" in reply_error_text(not_loaded, remote=False)
    lost = EngineClientError("the connection to the server was lost mid-reply (reset)")
    assert "Ember restarts it" in reply_error_text(lost, remote=False)
    assert "Ember restarts it" not in reply_error_text(lost, remote=True)
    refused = EngineClientError("loading bad failed: bad.gguf: truncated; good is still loaded", 400)
    assert load_failure_words("bad", refused) == "Could not load bad: bad.gguf: truncated. good is still loaded."


def test_each_reply_names_its_model_with_its_speed_on_hover(chat):
    store, chat_id, view, _actions = chat
    store.add_message(chat_id, "user", "hi")
    reply = store.add_message(chat_id, "assistant", "")
    store.update_message(reply, "hello", "done", tok_s=23.45, ttft=0.2, model="smollm2", finish_reason="stop")
    view.model_names = {"smollm2": "SmolLM2 135M Instruct"}
    view.set_messages(from_history(store.messages(chat_id), None))
    cursor = view.document().find("SmolLM2 135M Instruct")
    assert not cursor.isNull()
    assert cursor.charFormat().toolTip() == "23.4 tok/s · first token 200 ms"
    assert view.messages[1].finish_reason == "stop" and not view.messages[1].out_of_budget


def test_small_ones_log_wraps_export_confirms_and_no_tray_keeps_a_window(qtbot, tmp_path, monkeypatch):
    from PySide6.QtGui import QDesktopServices
    from PySide6.QtWidgets import QPlainTextEdit

    from ui.engine_controller import EngineController
    from ui.engine_log_dialog import EngineLogDialog
    from ui.main_window import MainWindow

    log_file = tmp_path / "logs" / "engine.log"
    log_file.parent.mkdir()
    log_file.write_text("x" * 2000 + "\n")
    dialog = EngineLogDialog(log_file, tmp_path / "logs" / "ember.log")
    qtbot.addWidget(dialog)
    assert all(v.lineWrapMode() == QPlainTextEdit.WidgetWidth for v in dialog.views.values())
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda _url: False)  # no file manager on this machine
    dialog.open_button.click()
    assert str(tmp_path / "logs") in dialog.version_label.text()
    assert QGuiApplication.clipboard().text() == str(tmp_path / "logs")

    settings = make_settings(tmp_path / "ember", close_to_tray=True)
    store = ChatStore(tmp_path / "chats.sqlite3")
    window = MainWindow(settings, store, EngineController(settings, None))
    qtbot.addWidget(window)
    window.show()
    view = window.new_chat()
    store.add_message(view.chat_id, "user", "hi")
    window.export_chat(view.chat_id, tmp_path / "c.md", "md")
    assert str(tmp_path / "c.md") in window.status.currentMessage()
    window.close()  # Ctrl+W with no tray: the window stays (minimized) and says how to quit
    assert window.isVisible() and "no system tray" in window.status.currentMessage().lower()
    store.close()


def test_a_chat_on_a_base_model_says_so(qtbot, tmp_path):
    from ui.engine_controller import EngineController
    from ui.main_window import MainWindow

    settings = make_settings(tmp_path / "ember")
    store = ChatStore(tmp_path / "chats.sqlite3")
    window = MainWindow(settings, store, EngineController(settings, None))
    qtbot.addWidget(window)
    view = window.new_chat()
    window._on_engine_status({"status": "ready", "model": "gemma-3-270m", "completion_only": True})
    assert "gemma-3-270m is a base model" in view.transcript.toPlainText()
    window._on_engine_status({"status": "ready", "model": "smollm2", "completion_only": False})
    assert "base model" not in view.transcript.toPlainText()
    store.close()


def test_replies_name_their_model_once_the_engine_lists_the_names(qtbot, tmp_path):
    from ui.engine_controller import EngineController
    from ui.main_window import MainWindow

    settings = make_settings(tmp_path / "ember")
    store = ChatStore(tmp_path / "chats.sqlite3")
    chat_id = store.create_chat("t")
    store.add_message(chat_id, "user", "hi")
    reply = store.add_message(chat_id, "assistant", "")
    store.update_message(reply, "hello", "done", model="smollm2")
    engine = EngineController(settings, None)
    window = MainWindow(settings, store, engine)  # as after a restart: the names are not known yet
    qtbot.addWidget(window)
    view = window.current_view()
    assert "smollm2" in view.transcript.toPlainText().split("\n")[-1]
    engine._on_models([{"id": "smollm2", "name": "SmolLM2 135M Instruct"}])
    qtbot.waitUntil(lambda: "SmolLM2 135M Instruct" in view.transcript.toPlainText(), timeout=2000)
    store.close()
