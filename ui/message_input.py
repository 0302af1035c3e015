"""The chat input box: Enter sends, Shift+Enter starts a new line; a pasted image goes to the chat's
images (ui/chat_images.py), not into the text."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QMimeData, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget

from app.history_images import is_image_path


def holds_images(mime: QMimeData) -> bool:
    """A picture (a screenshot copied), or image files copied in a file manager."""
    return mime.hasImage() or any(u.isLocalFile() and is_image_path(Path(u.toLocalFile())) for u in mime.urls())


class MessageInput(QPlainTextEdit):
    """`submitted(text)` on Enter (not Shift+Enter), also with no text (the message may be images
    alone: the chat decides); `images_pasted(mime)` for a paste that holds images."""

    submitted = Signal(str)
    images_pasted = Signal(QMimeData)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("messageInput")
        self.setPlaceholderText("Message Ember…  (Enter to send, Shift+Enter for a new line)")
        self.setTabChangesFocus(True)
        self.setFixedHeight(72)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        is_enter = event.key() in (Qt.Key_Return, Qt.Key_Enter)
        if is_enter and not (event.modifiers() & Qt.ShiftModifier):
            self.submitted.emit(self.toPlainText().strip())
            event.accept()
            return
        if is_enter:  # Shift+Enter: a plain new line, not a paragraph separator
            self.insertPlainText("\n")
            event.accept()
            return
        super().keyPressEvent(event)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802 - Qt name
        return holds_images(source) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802 - Qt name
        if holds_images(source):
            self.images_pasted.emit(source)
            return
        super().insertFromMimeData(source)
