"""Per-message actions (issue 16 item 7), clicked as a user clicks them, on real widgets offscreen: copy a
message and a code block, syntax colours from pygments, edit & resend and flipping between regenerated
replies against a real engine, and a long chat opening at its latest message."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QTextCursor
from PySide6.QtWidgets import QApplication

from app.gui_main import build_app
from app.history import ChatStore
from ui.transcript import TranscriptView
from ui.transcript_message import TranscriptMessage
from test_ui_first_hour import ember  # noqa: F401 - the app on the shared engine
from ui_support import make_settings, shared_engine, tiny_gguf  # noqa: F401

pytestmark = pytest.mark.timeout(300)
CODE_REPLY = "Here:\n\n```python\ndef add(a, b):\n    return a + b  # sum\n```\n\nand\n\n```sh\necho hi\n```\n"


def click_link(qtbot, browser: TranscriptView, text: str, nth: int = 0) -> None:
    """Click the `nth` link whose text is `text`, with the mouse, where it is drawn."""
    doc, cursor = browser.document(), None
    for _ in range(nth + 1):
        cursor = doc.find(text, cursor or QTextCursor(doc))
        assert not cursor.isNull(), f"no link {text!r}"
    start, end = QTextCursor(cursor), QTextCursor(cursor)
    start.setPosition(cursor.selectionStart())
    end.setPosition(cursor.selectionEnd())
    browser.setTextCursor(end)
    browser.ensureCursorVisible()
    a, b = browser.cursorRect(start).center(), browser.cursorRect(end).center()
    pos = (a + b) / 2  # the middle of the link's text
    assert browser.anchorAt(pos).startswith("ember:"), f"{text!r} is not a link where it is drawn"
    qtbot.mouseClick(browser.viewport(), Qt.LeftButton, pos=pos)


def test_code_blocks_are_coloured_and_each_has_copy_code(qtbot):
    view = TranscriptView()
    qtbot.addWidget(view)
    view.resize(600, 500)
    view.show()
    view.set_messages([TranscriptMessage("user", "add?"), TranscriptMessage("assistant", CODE_REPLY)])
    doc = view.document()
    kw = doc.find("def")
    plain = doc.find("Here")
    assert kw.charFormat().foreground().color() != plain.charFormat().foreground().color(), "no syntax colour"
    comment = doc.find("# sum")
    assert comment.charFormat().foreground().color() != kw.charFormat().foreground().color()
    got = []
    view.action_requested.connect(lambda *a: got.append(a))
    click_link(qtbot, view, "Copy code", nth=1)
    assert got == [("code", 1, 1)]
    assert view.code_block_texts(1) == ["def add(a, b):\n    return a + b  # sum", "echo hi"]


def test_copy_flip_between_regenerations_and_edit_and_resend(qtbot, ember):
    view = ember.window.new_chat()
    ember.chat_store.update_chat_settings(view.chat_id, {"temperature": 1.5, "max_tokens": 24})
    with qtbot.waitSignal(view.reply_finished, timeout=120_000):
        view.send("Say something")
    first = view.transcript.messages[-1].content
    click_link(qtbot, view.transcript, "Copy", nth=1)  # the reply's Copy (the question has the first)
    assert QGuiApplication.clipboard().text() == first

    second = first
    for _ in range(5):  # sampled at 1.5: a different reply within a few tries
        with qtbot.waitSignal(view.reply_finished, timeout=120_000):
            qtbot.mouseClick(view.regenerate_button, Qt.LeftButton)
        second = view.transcript.messages[-1].content
        if second != first:
            break
    assert second != first
    reply = view.transcript.messages[-1]
    assert first in reply.versions and reply.content == second
    assert f"reply {len(reply.versions)} of {len(reply.versions)}" in view.transcript.toPlainText()
    for _ in range(len(reply.versions) - 1):
        click_link(qtbot, view.transcript, "‹")
    assert view.transcript.messages[-1].content == first and "reply 1 of" in view.transcript.toPlainText()
    stored = ember.chat_store.messages(view.chat_id)
    assert stored[-1].content == first, "the reply shown is the one the next turn builds on"

    again = build_app(ember.settings, supervisor=ember.controller.supervisor)  # the app started anew
    qtbot.addWidget(again.window)
    reopened = again.window.open_chat(view.chat_id).transcript
    assert reopened.messages[-1].versions == reply.versions and reopened.messages[-1].content == first
    assert "reply 1 of" in reopened.toPlainText(), "a reopened chat lost the replies Regenerate wrote"
    again.chat_store.close()

    click_link(qtbot, view.transcript, "Edit & resend")
    assert view.input.toPlainText() == "Say something" and QApplication.focusWidget() is view.input
    assert view.transcript.messages == [] and ember.chat_store.messages(view.chat_id) == []
    qtbot.keyClicks(view.input, " again")
    with qtbot.waitSignal(view.reply_finished, timeout=120_000):
        qtbot.keyClick(view.input, Qt.Key_Return)
    assert [m.content for m in ember.chat_store.messages(view.chat_id)][0] == "Say something again"


def test_a_long_chat_opens_at_its_latest_message(qtbot, tmp_path):
    settings = make_settings(tmp_path / "app")
    store = ChatStore(settings.history_path)
    chat = store.create_chat("Long")
    for i in range(60):
        store.add_message(chat, "user", f"Question {i}")
        store.add_message(chat, "assistant", f"Answer {i}\n\n" + "A long line of text. " * 12)
    store.close()
    app = build_app(settings)
    qtbot.addWidget(app.window)
    app.window.resize(900, 600)
    app.window.show()
    view = app.window.open_chat(chat)
    bar = view.transcript.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum(), timeout=5000)
    rect = view.transcript.viewport().rect()
    last = view.transcript.cursorForPosition(rect.center()).block().text()
    assert "59" in last or "A long line" in last
    app.chat_store.close()
