"""Documents in the window, on a real engine process (a tiny chat model, the real all-MiniLM-L6-v2,
backend auto) over real HTTP: the Documents view makes a collection, adds a real file and shows it
indexed, and Sync follows the disk; a chat given a file sends `documents` with its question, shows
the reply's sources and keeps them in the history across reopening; a chat with files on a machine
with no embedding model says so before sending.

Oracles we did not write: the engine's own Vector Stores API (the `openai` client's shapes are
tested in tests/server/test_vector_stores_api.py), SQLite, and Qt's widgets."""
from __future__ import annotations

import pytest
from docs_kit import FILES, minilm_store
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication

from app.client import EngineClient
from ui.chat_documents import OWN_KEY
from ui.transcript_message import from_history
from ui_support import app_on, make_settings, start_engine, LONG_KV
from server_util import LONG_CTX

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
WAIT_MS = 120_000  # indexing and replies on a loaded 2-core machine


@pytest.fixture(scope="module")
def docs_engine(tmp_path_factory, tiny_model_factory):
    """An engine whose store holds the real MiniLM, and the settings it runs with (the app's too)."""
    settings = make_settings(tmp_path_factory.mktemp("docs-engine"), backend="auto")
    minilm_store(settings.models_dir)
    sup = start_engine(settings, tiny_model_factory(ctx=LONG_CTX), extra_args=LONG_KV)
    yield settings, sup
    sup.stop()


@pytest.fixture
def app(qtbot, docs_engine):
    settings, sup = docs_engine
    with app_on(qtbot, settings, sup) as ember:
        qtbot.waitUntil(lambda: ember.controller.client() is not None, timeout=WAIT_MS)
        yield ember


def drop(widget, paths) -> None:
    """Files dragged from a file manager and dropped on `widget` (Qt's own drag events, as XDND delivers them)."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    pos = widget.rect().center()
    enter = QDragEnterEvent(pos, Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(widget, enter)
    assert enter.isAccepted()
    QApplication.sendEvent(widget, QDropEvent(QPointF(pos), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier))


def state_of(table, name: str) -> str:
    for row in range(table.rowCount()):
        if table.item(row, 0) is not None and table.item(row, 0).text() == name:
            return table.item(row, 1).text()
    return ""


def test_the_documents_view_adds_a_real_file_and_shows_it_indexed_and_syncs(qtbot, app, tmp_path):
    notes = tmp_path / "recipes.md"
    notes.write_text(FILES["recipes.md"])
    gone = tmp_path / "quota.py"
    gone.write_text(FILES["quota.py"])
    dialog = app.open_documents()
    dialog.create_collection("Family notes")
    qtbot.waitUntil(lambda: dialog.collections.currentItem() is not None
                    and dialog.collections.currentItem().text() == "Family notes", timeout=WAIT_MS)
    dialog.add_paths([notes])
    drop(dialog.files.viewport(), [gone])
    qtbot.waitUntil(lambda: state_of(dialog.files, "recipes.md").startswith("Indexed")
                    and state_of(dialog.files, "quota.py").startswith("Indexed"), timeout=WAIT_MS)
    (store,) = [s for s in EngineClient(app.controller.base_url, app.controller.api_key).vector_stores()
                if s["id"] == dialog.current_id()]
    assert store["name"] == "Family notes" and store["file_counts"]["completed"] == 2
    attrs = {f["attributes"]["path"] for f in dialog.files.files}
    assert attrs == {str(notes.resolve()), str(gone.resolve())}

    other = tmp_path / "gardening_tips.md"  # added by another program: no path in its attributes
    other.write_text(FILES["gardening_tips.md"])
    api = EngineClient(app.controller.base_url, app.controller.api_key)
    api.attach_file(dialog.current_id(), api.upload_file(other)["id"])
    dialog.refresh_files()
    qtbot.waitUntil(lambda: state_of(dialog.files, "gardening_tips.md").startswith("Indexed"), timeout=WAIT_MS)

    notes.write_text(FILES["recipes.md"] + "\n## Soup\n\nLeek soup takes 9 leeks.\n")
    gone.unlink()
    old_ids = {f["id"] for f in dialog.files.files}
    dialog.sync_collection()
    qtbot.waitUntil(lambda: dialog.message.text().startswith("Synced: 1 changed file indexed again, 1 removed"),
                    timeout=WAIT_MS)
    qtbot.waitUntil(lambda: len(dialog.files.files) == 2 and state_of(dialog.files, "recipes.md").startswith(
        "Indexed"), timeout=WAIT_MS)
    (again,) = [f for f in dialog.files.files if (f.get("attributes") or {}).get("path")]
    assert again["id"] not in old_ids  # uploaded again; the other program's file left alone

    dialog.rename_collection("Kitchen")
    qtbot.waitUntil(lambda: dialog.collections.currentItem().text() == "Kitchen", timeout=WAIT_MS)
    dialog.delete_current()
    qtbot.waitUntil(lambda: all(dialog.collections.item(i).text() != "Kitchen"
                                for i in range(dialog.collections.count())), timeout=WAIT_MS)


def test_a_chat_with_a_file_sends_documents_and_keeps_its_sources(qtbot, app, tmp_path, monkeypatch):
    sent: list[dict] = []
    original = EngineClient.chat_stream

    def chat_stream(self, messages, *args, **kwargs):  # the real request, its documents noted
        sent.append(kwargs.get("documents"))
        return original(self, messages, *args, **kwargs)

    monkeypatch.setattr(EngineClient, "chat_stream", chat_stream)
    cake = tmp_path / "recipes.md"
    cake.write_text(FILES["recipes.md"])
    view = app.window.new_chat()
    app.chat_store.update_chat_settings(view.chat_id, {"temperature": 0.0, "max_tokens": 8})
    drop(view.transcript.viewport(), [cake])  # dropped on the chat
    qtbot.waitUntil(lambda: "recipes.md: Indexed" in view.docs.line.text(), timeout=WAIT_MS)
    own = app.chat_store.get_chat(view.chat_id).settings[OWN_KEY]

    view.send("How many grams of rye flour does Grandma Irelle's plum cake need?")
    qtbot.waitUntil(lambda: not view.is_streaming, timeout=WAIT_MS)
    assert sent == [{"vector_store_ids": [own]}]
    client = EngineClient(app.controller.base_url, app.controller.api_key)
    title = app.chat_store.get_chat(view.chat_id).title  # the question's start; the collection follows it
    assert title.startswith("How many grams")
    qtbot.waitUntil(lambda: [s["name"] for s in client.vector_stores() if s["id"] == own] == [f"Chat: {title}"],
                    timeout=WAIT_MS)
    reply = view.transcript.messages[-1]
    assert reply.status == "done", reply.error
    assert reply.sources and reply.sources[0].filename == "recipes.md"
    assert "340 grams" in reply.sources[0].text and reply.sources[0].vector_store_id == own
    assert "Sources" in view.transcript.toPlainText() and "recipes.md" in view.transcript.toPlainText()

    stored = app.chat_store.messages(view.chat_id)[-1]
    assert stored.sources == reply.sources
    reopened = from_history(app.chat_store.messages(view.chat_id), None)[-1]
    assert reopened.sources == reply.sources
    dialog = view.docs.show_source(len(view.transcript.messages) - 1, reply.sources[0].index)
    assert "340 grams" in dialog.text.toPlainText() and "recipes.md" in dialog.header.text()
    qtbot.waitUntil(lambda: dialog.where.text() == str(cake.resolve()), timeout=WAIT_MS)  # asked of the engine
    dialog.close()


def test_a_chat_with_files_and_no_embedding_model_says_so_before_sending(qtbot, tmp_path, docs_engine):
    _, sup = docs_engine
    bare = make_settings(tmp_path / "bare")  # its model store holds no embedding model
    with app_on(qtbot, bare, sup) as ember:
        view = ember.window.new_chat()
        ember.chat_store.update_chat_settings(view.chat_id, {OWN_KEY: "vs_anything"})
        view.input.setPlainText("What does my file say?")
        view.send(view.input.toPlainText())
        assert not view.is_streaming and ember.chat_store.messages(view.chat_id) == []
        assert "No embedding model is installed" in view.docs.line.text()
        assert "Model manager" in view.docs.line.text()
        assert view.input.toPlainText() == "What does my file say?"  # kept, to send once one is installed
