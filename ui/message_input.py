"""The chat input box: Enter sends, Shift+Enter starts a new line."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget


class MessageInput(QPlainTextEdit):
    """`submitted(text)` on Enter (not Shift+Enter); the box clears itself once it is taken."""

    submitted = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("messageInput")
        self.setPlaceholderText("Message Ember…  (Enter to send, Shift+Enter for a new line)")
        self.setTabChangesFocus(True)
        self.setFixedHeight(72)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        is_enter = event.key() in (Qt.Key_Return, Qt.Key_Enter)
        if is_enter and not (event.modifiers() & Qt.ShiftModifier):
            text = self.toPlainText().strip()
            if text:
                self.submitted.emit(text)
            event.accept()
            return
        if is_enter:  # Shift+Enter: a plain new line, not a paragraph separator
            self.insertPlainText("\n")
            event.accept()
            return
        super().keyPressEvent(event)
