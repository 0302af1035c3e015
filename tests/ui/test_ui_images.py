"""Images in the window, on a real engine process serving tests/vlm_factory.py's tiny random vision model
from its store (the manifest names its projector; the llama.cpp backend), over real HTTP: an image
pasted from the clipboard and one dropped on the chat show as thumbnails above the message box (one
removed by its ×), the message goes out with them as OpenAI `image_url` data: parts and gets a reply;
the next turn sends them again; the transcript draws them; the chat reopened by a fresh app (the same
SQLite history) still holds and draws them; the Markdown export copies them beside itself. A chat
whose model has no projector says so before sending: the button disabled with the reason, a paste
refused in a red line, nothing stored. Random weights: plumbing, not answer quality.

Oracles we did not write: the engine's own image path (its 400 for a model without a projector is
tested in tests/server/test_openai_images.py), SQLite, Qt's clipboard and drag and drop events."""
from __future__ import annotations

import base64
import dataclasses
import io

import pytest
from PIL import Image as PILImage
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QImage, QTextDocument
from PySide6.QtWidgets import QApplication

from app.client import EngineClient
from app.store import ModelStore
from engine.model_files.manifest import write_manifest
from ui.chat_warm import warm_request
from ui_support import app_on, make_settings, start_engine
from vlm_factory import random_pixels, write_tiny_vlm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
WAIT_MS = 120_000
GEMMA_TEMPLATE = ("{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
                  "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n"
                  "{% endif %}")
VLM, BLIND = "tiny-vlm", "tiny-blind"


def png(seed: int) -> bytes:
    buf = io.BytesIO()
    PILImage.fromarray(random_pixels(seed)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def vision_engine(tmp_path_factory, tiny_model_factory):
    """An engine on the store's vision model (its manifest pairs the projector), and a model beside it
    that cannot see."""
    root = tmp_path_factory.mktemp("vision-ui")
    settings = make_settings(root, backend="llama.cpp", default_model=VLM, threads=1)
    vlm = write_tiny_vlm(root / "files", chat_template=GEMMA_TEMPLATE)
    store = ModelStore(settings.models_dir)
    write_manifest(settings.models_dir, dataclasses.replace(
        store.register(vlm.model, model_id=VLM, source="import"), mmproj=str(vlm.mmproj)))
    store.register(tiny_model_factory(), model_id=BLIND, source="import")
    sup = start_engine(settings, None, extra_args=("--num-kv-blocks", "512"))
    yield settings, sup
    sup.stop()


def drop(widget, paths) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    pos = widget.rect().center()
    enter = QDragEnterEvent(pos, Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(widget, enter)
    assert enter.isAccepted()
    QApplication.sendEvent(widget, QDropEvent(QPointF(pos), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier))


def drawn(view, sha256: str) -> bool:
    """The transcript's document holds the image and draws it (a real picture, not an empty one)."""
    image = view.transcript.document().resource(QTextDocument.ImageResource, QUrl(f"ember-image:{sha256}"))
    return f"ember-image:{sha256}" in view.transcript.toHtml() and isinstance(image, QImage) and not image.isNull()


def test_images_pasted_and_dropped_are_sent_kept_and_shown_after_a_restart(qtbot, vision_engine, tmp_path,
                                                                         monkeypatch):
    settings, sup = vision_engine
    sent: list[list[dict]] = []
    original = EngineClient.chat_stream

    def chat_stream(self, messages, *args, **kwargs):  # the real request, its messages noted
        sent.append(messages)
        return original(self, messages, *args, **kwargs)

    monkeypatch.setattr(EngineClient, "chat_stream", chat_stream)
    dropped = tmp_path / "noise.png"
    dropped.write_bytes(png(2))
    with app_on(qtbot, settings, sup) as app:
        qtbot.waitUntil(lambda: app.controller.client() is not None and bool(app.controller.models), timeout=WAIT_MS)
        view = app.window.new_chat()
        app.chat_store.update_chat_settings(view.chat_id, {"temperature": 0.0, "max_tokens": 4})
        assert view.images.button.isEnabled(), view.images.button.toolTip()
        QApplication.clipboard().setImage(QImage.fromData(png(1)))
        view.input.setFocus()
        qtbot.keyClick(view.input, Qt.Key_V, Qt.ControlModifier)  # pasted
        assert len(view.images.pending) == 1 and view.input.toPlainText() == ""
        drop(view.transcript.viewport(), [dropped, dropped])  # dropped (twice: one is taken out again)
        assert view.images.strip.isVisible() and len(view.images.strip.tiles) == 3
        remove = view.images.strip.tiles[2].findChild(type(view.images.button), "removeImage")
        qtbot.mouseClick(remove, Qt.LeftButton)
        assert [name for _, name in view.images.pending] == ["", "noise.png"]

        qtbot.keyClicks(view.input, "What is in these pictures?")
        with qtbot.waitSignal(view.reply_finished, timeout=WAIT_MS) as done:
            qtbot.keyClick(view.input, Qt.Key_Return)
        assert done.args[1] == "done", view.transcript.messages[-1].error
        assert not view.images.strip.isVisible() and view.images.pending == []
        question = app.chat_store.messages(view.chat_id)[0]
        assert [r.name for r in question.images] == ["", "noise.png"] and question.content.startswith("What is")
        assert app.chat_store.images.read(question.images[1]) == png(2)
        parts = sent[0][-1]["content"]
        assert parts[0] == {"type": "text", "text": "What is in these pictures?"}
        assert [p["type"] for p in parts[1:]] == ["image_url", "image_url"]
        assert base64.b64decode(parts[2]["image_url"]["url"].split(",", 1)[1]) == png(2)
        assert all(drawn(view, r.sha256) for r in question.images)

        view.send("And now?")  # the next turn sends the pictures again, with the first question
        qtbot.waitUntil(lambda: not view.is_streaming, timeout=WAIT_MS)
        assert view.transcript.messages[-1].status == "done", view.transcript.messages[-1].error
        assert sent[1][0] == sent[0][-1] and sent[1][-1] == {"role": "user", "content": "And now?"}
        out = tmp_path / "export" / "pictures.md"
        out.parent.mkdir()
        app.window.export_chat(view.chat_id, out, "md")
        assert f"(<pictures_images/{question.images[1].file_name}>)" in out.read_text()
        assert (out.parent / "pictures_images" / question.images[1].file_name).read_bytes() == png(2)
        chat_id = view.chat_id

    with app_on(qtbot, settings, sup) as app:  # a fresh app on the same history: after a restart
        view = app.window.open_chat(chat_id)
        first = view.transcript.messages[0]
        assert [r.name for r in first.images] == ["", "noise.png"]
        assert all(drawn(view, r.sha256) for r in first.images)
        warm_messages = warm_request(view)[0]  # the reopened chat is warmed with its pictures, as sent
        assert warm_messages[:2] == sent[1][:2]
        view.actions.edit(0)  # Edit & resend: the question back in the box, its pictures under it again
        assert view.input.toPlainText() == "What is in these pictures?"
        assert [name for _, name in view.images.pending] == ["", "noise.png"] and view.images.strip.isVisible()


def test_a_chat_whose_model_cannot_see_says_so_before_sending(qtbot, vision_engine):
    settings, sup = vision_engine
    with app_on(qtbot, settings, sup) as app:
        view = app.window.new_chat()
        app.chat_store.set_chat_model(view.chat_id, BLIND)
        view.images.refresh()
        assert not view.images.button.isEnabled()
        assert "cannot see images" in view.images.button.toolTip() and BLIND in view.images.button.toolTip()
        mime = QMimeData()
        mime.setImageData(QImage.fromData(png(3)))
        view.input.insertFromMimeData(mime)  # a paste
        assert view.images.pending == [] and view.images.line.isVisible()
        assert "no vision projector" in view.images.line.text()
        assert view.images.image_uri() is None  # earlier turns' images go to it as their text alone

        app.chat_store.set_chat_model(view.chat_id, VLM)  # a vision model: images go in; back to blind: refused
        view.images.refresh()
        view.input.insertFromMimeData(mime)
        assert len(view.images.pending) == 1 and view.images.button.isEnabled() and not view.images.line.isVisible()
        app.chat_store.set_chat_model(view.chat_id, BLIND)
        view.send("What is this?")
        assert not view.is_streaming and app.chat_store.messages(view.chat_id) == []
        assert "cannot see images" in view.images.line.text() and len(view.images.pending) == 1
