"""What the links under each message do: copy it, copy one of its code blocks, edit & resend a
question, flip between the replies Regenerate wrote. Runs on the GUI thread (no I/O but SQLite)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtGui import QGuiApplication, QTextCursor

if TYPE_CHECKING:
    from ui.chat_view import ChatView


class MessageActions:
    """`run(action, index, block)` is connected to TranscriptView.action_requested."""

    def __init__(self, view: ChatView) -> None:
        self.view = view

    def run(self, action: str, index: int, block: int = -1) -> None:
        msgs = self.view.transcript.messages
        if not 0 <= index < len(msgs):
            return
        handler = {"copy": self.copy, "code": self.copy_code, "edit": self.edit,
                   "prev": lambda i, _b: self.flip(i, -1), "next": lambda i, _b: self.flip(i, +1)}.get(action)
        if handler is not None:
            handler(index, block)

    def copy(self, index: int, _block: int = -1) -> None:
        QGuiApplication.clipboard().setText(self.view.transcript.messages[index].content)

    def copy_code(self, index: int, block: int) -> None:
        blocks = self.view.transcript.code_block_texts(index)
        if 0 <= block < len(blocks):
            QGuiApplication.clipboard().setText(blocks[block])

    def edit(self, index: int, _block: int = -1) -> None:
        """Put a question back in the message box, and drop it and everything after it (sent again on Enter)."""
        view = self.view
        m = view.transcript.messages[index]
        if m.role != "user":
            return
        view.stop()
        for later in view.transcript.messages[index:]:
            if later.msg_id is not None:
                view.chat_store.delete_message(later.msg_id)
        del view.transcript.messages[index:]
        view.transcript.render_now()
        view.input.setPlainText(m.content)
        view.input.moveCursor(QTextCursor.End)
        view.input.setFocus()
        view.update_buttons()

    def flip(self, index: int, step: int) -> None:
        """Show an earlier or later reply; the one shown is the one the next turn builds on."""
        view = self.view
        m = view.transcript.messages[index]
        if view.is_streaming or not m.flip(step):
            return
        if m.msg_id is not None:
            view.chat_store.update_message(m.msg_id, m.content, "done")
            m.status = "done"
        view.keep_versions(m)
        view.transcript.render_now()
