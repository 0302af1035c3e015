"""A deleted chat leaves nothing of its own alive in the GUI process (not timed).

`ember bench soak-gui` measures the GUI's memory over many rounds; this pins the cause it would
find: after a round of real streamed replies (one stopped midway, one regenerated) on a real
engine process, every chat deleted from the list must take its view, transcript, input and
reply worker with it. Two views of that: on the Python side weak references, which die only
when nothing holds the object; on Qt's side the window's children (a Python wrapper can die
while its widget lives on under the window, so weak references alone would miss that).
"""
from __future__ import annotations

import weakref
from types import SimpleNamespace

import pytest
from PySide6.QtWidgets import QApplication

from app.bench.soak_gui import _settle, one_round
from app.gui_main import build_app
from ui.chat_view import ChatView
from ui.message_input import MessageInput
from ui.transcript import TranscriptView
from ui_support import make_settings, replies_ignore_eos, shared_engine, tiny_gguf  # noqa: F401

pytestmark = pytest.mark.timeout(300)


def test_deleted_chats_take_their_widgets_and_workers_with_them(qtbot, tmp_path, shared_engine, monkeypatch):  # noqa: F811
    replies_ignore_eos(monkeypatch)  # the stopped reply is still running when the round stops it
    app = build_app(make_settings(tmp_path / "app"), supervisor=shared_engine, poll_interval_ms=200)
    qtbot.addWidget(app.window)
    app.window.show()
    app.controller.start()
    qtbot.waitUntil(lambda: bool(app.controller.models), timeout=60_000)
    made: list[tuple[int, weakref.ref]] = []  # (chat id, its view, transcript, input, reply worker)
    new_chat = app.window.new_chat

    def recording_new_chat():
        view = new_chat()
        made.extend((view.chat_id, weakref.ref(w)) for w in (view, view.transcript, view.input))
        send = view.send

        def recording_send(text):
            send(text)
            made.append((view.chat_id, weakref.ref(view._worker)))
        view.send = recording_send
        return view

    monkeypatch.setattr(app.window, "new_chat", recording_new_chat)
    try:
        rounds = [one_round(QApplication.instance(), app, i, SimpleNamespace(chats=3, keep=1, max_tokens=8))
                  for i in range(2)]
        _settle(QApplication.instance())
        assert [r["errors"] for r in rounds] == [0, 0]
        assert all(r["stopped"] >= 1 for r in rounds), "the round stops one reply midway"
        kept = {c.id for c in app.chat_store.list_chats()}
        assert len(kept) == 1 and set(app.window._views) == kept
        assert len(made) == 6 * 4
        alive = [(cid, type(r()).__name__) for cid, r in made if cid not in kept and r() is not None]
        assert not alive, f"deleted chats are still held from Python: {alive}"
        under_window = {cls.__name__: len(app.window.findChildren(cls)) for cls in (ChatView, TranscriptView, MessageInput)}
        assert under_window == {"ChatView": 1, "TranscriptView": 1, "MessageInput": 1}, \
            f"deleted chats' widgets still live under the window: {under_window}"
    finally:
        for view in list(app.window._views.values()):
            view.stop()
        app.controller.close()
        app.chat_store.close()
