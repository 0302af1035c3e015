"""The row under a chat's message box: the reply's figures, Regenerate, Stop and Send."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QWidget

from ui.elided_label import ElidedLabel
from ui.resource_attach import ResourceButton


def add_buttons(view: QWidget) -> QHBoxLayout:
    """Make `view.send_button`, `stop_button`, `regenerate_button` and `info_label`; returns their row."""
    view.send_button = QPushButton("Send", view, objectName="sendButton")
    view.stop_button = QPushButton("Stop", view)
    view.regenerate_button = QPushButton("Regenerate", view)
    view.info_label = ElidedLabel(parent=view)
    view.regenerate_button.setToolTip("Write the last reply again (Ctrl+R)")
    view.stop_button.setToolTip("Stop the reply (Esc)")
    view.send_button.setToolTip("Send the message (Enter)")
    row = view.buttons_row = QHBoxLayout()  # ui/chat_documents.py adds its Files… button here, ui/chat_images.py
    row.setSpacing(4)  # its picture button: the row of seven still fits a narrow window (under 760 px)
    row.addWidget(view.info_label, 1)
    view.attach_button = None
    if view.agent.tools is not None:  # MCP resources into the message (ui/resource_attach.py)
        view.attach_button = ResourceButton(view.agent.tools, lambda: view.chat_store.get_chat(view.chat_id).settings,
                                            view.input, view)
        view.attach_button.setFocusPolicy(Qt.TabFocus)
        row.addWidget(view.attach_button)
    for b in (view.regenerate_button, view.stop_button, view.send_button):
        b.setFocusPolicy(Qt.TabFocus)  # a click leaves the keyboard in the message box
        row.addWidget(b)
    return row


def keep_typing_focus(view: QWidget, focus: QWidget | None) -> None:
    """A button that had the keyboard (and is now disabled) must not hand it on to the search box."""
    if view.isVisible() and (focus is None or focus in (view.send_button, view.stop_button, view.regenerate_button)):
        view.input.setFocus()


def put_back(view: QWidget, text: str) -> None:
    """An edited question back in the message box, to send again on Enter."""
    view.input.setPlainText(text)
    view.input.moveCursor(QTextCursor.End)
    view.input.setFocus()
    view.update_buttons()
