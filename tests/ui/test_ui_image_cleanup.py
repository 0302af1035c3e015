"""A question deleted on its own takes its pictures with it, those no other message holds; Edit &
resend still gets them back into the message box (read before they go) and Send keeps them again.
The whole app on the shared engine, the transcript's own links clicked, the real image folder."""
from __future__ import annotations

import io

import pytest
from PIL import Image as PILImage
from PySide6.QtCore import Qt

from app.store import ModelStore

from test_ui_first_hour import ember  # noqa: F401 - the app on the shared engine
from test_ui_messages import click_link
from ui_support import shared_engine  # noqa: F401 - fixture
from vlm_factory import random_pixels, write_tiny_vlm

pytestmark = pytest.mark.timeout(300)


def png(seed: int) -> bytes:
    buf = io.BytesIO()
    PILImage.fromarray(random_pixels(seed)).save(buf, format="PNG")
    return buf.getvalue()


def test_a_deleted_question_takes_its_own_pictures_and_edit_keeps_them(qtbot, ember, tmp_path):  # noqa: F811
    vlm = write_tiny_vlm(tmp_path / "vlm")  # the chats' model, paired with its projector: it sees
    ModelStore(ember.settings.models_dir).import_path(vlm.model, model_id="eye", mode="link", mmproj=vlm.mmproj)
    store, folder = ember.chat_store, ember.chat_store.images
    own, shared = folder.add(png(1), "own.png"), folder.add(png(2), "shared.png")
    first = store.create_chat("two pictures", model="eye")
    store.add_message(first, "user", "What is in these?", images=[own, shared])
    store.add_message(first, "assistant", "Noise.")
    second = store.create_chat("one of them again", model="eye")
    store.add_message(second, "user", "And this one?", images=[shared])
    store.add_message(second, "assistant", "Noise too.")

    view = ember.window.open_chat(first)
    click_link(qtbot, view.transcript, "Delete")  # the question's
    assert [m.role for m in store.messages(first)] == ["assistant"]
    assert not folder.path(own).exists()  # nothing else holds it
    assert folder.read(shared) == png(2)  # the other chat's question still does

    view = ember.window.open_chat(second)
    click_link(qtbot, view.transcript, "Edit & resend")
    assert store.messages(second) == [] and view.input.toPlainText() == "And this one?"
    assert view.images.pending == [(png(2), "shared.png")]  # read back before its file went
    assert not folder.path(shared).exists()  # held by no message now: the box holds the bytes
    with qtbot.waitSignal(view.reply_finished, timeout=120_000):
        qtbot.keyClick(view.input, Qt.Key_Return)
    (question, *_) = store.messages(second)  # (the shared engine has no "eye": its reply says so)
    assert question.content == "And this one?" and question.images == [shared]
    assert folder.read(shared) == png(2)  # kept again by Send
    assert view.images.pending == []
