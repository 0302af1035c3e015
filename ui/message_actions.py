"""What the links under each message do: copy it, copy one of its code blocks, edit & resend a
question, flip between the replies Regenerate wrote. Runs on the GUI thread (no I/O but SQLite).

The chat view passes in what the actions touch (its transcript, the store, the kept versions, how
to tell and stop a reply in flight) and puts an edited question back in its message box on
`edit_requested`: the actions never reach into the view."""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QGuiApplication

from app.history import ChatStore
from app.reply_versions import ReplyVersions
from ui.transcript import TranscriptView
from ui.transcript_message import TranscriptMessage


def keep_versions(versions: ReplyVersions | None, m: TranscriptMessage) -> None:
    """Store a reply's versions and the one shown, so a reopened chat can still flip between them."""
    if versions is not None and m.msg_id is not None and len(m.versions) > 1:
        versions.put(m.msg_id, m.versions, m.shown)


class MessageActions(QObject):
    """`run(action, index, block)` is connected to TranscriptView.action_requested."""

    edit_requested = Signal(str, list)  # a question taken back: its text and images, for the message box
    continue_requested = Signal(int)  # a reply that thought through its budget, to go on (the chat view streams it)
    source_requested = Signal(int, int)  # a reply's `[n]` or listed source clicked: message index, source number

    def __init__(self, transcript: TranscriptView, chat_store: ChatStore, versions: ReplyVersions | None,
                 is_streaming: Callable[[], bool], stop: Callable[[], None], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.transcript = transcript
        self.chat_store = chat_store
        self.versions = versions
        self._is_streaming = is_streaming
        self._stop = stop

    def run(self, action: str, index: int, block: int = -1) -> None:
        msgs = self.transcript.messages
        if not 0 <= index < len(msgs):
            return
        handler = {"copy": self.copy, "code": self.copy_code, "edit": self.edit, "delete": self.delete,
                   "continue": lambda i, _b: self.continue_requested.emit(i),
                   "source": self.source_requested.emit,
                   "prev": lambda i, _b: self.flip(i, -1), "next": lambda i, _b: self.flip(i, +1)}.get(action)
        if handler is not None:
            handler(index, block)

    def copy(self, index: int, _block: int = -1) -> None:
        m = self.transcript.messages[index]
        QGuiApplication.clipboard().setText(m.content or m.reasoning)  # a reply that only thought: its thoughts

    def copy_code(self, index: int, block: int) -> None:
        blocks = self.transcript.code_block_texts(index)
        if 0 <= block < len(blocks):
            QGuiApplication.clipboard().setText(blocks[block])

    def edit(self, index: int, _block: int = -1) -> None:
        """Take a question back, dropping it and everything after it (sent again on Enter)."""
        m = self.transcript.messages[index]
        if m.role != "user":
            return
        self._stop()
        dropped = self.transcript.messages[index:]
        for later in dropped:
            if later.msg_id is not None:  # the pictures stay until the message box has read them back
                self.chat_store.delete_message(later.msg_id, keep_images=True)
        del self.transcript.messages[index:]
        self.transcript.render_now()
        self.edit_requested.emit(m.content, list(m.images))
        self.chat_store.drop_images([r for later in dropped for r in later.images])  # Send keeps them again

    def delete(self, index: int, _block: int = -1) -> None:
        """Remove one message, from the chat and from what the next turn sends; the reply in flight
        is stopped first when it is the one removed."""
        m = self.transcript.messages[index]
        if m.status == "streaming":
            self._stop()
        if m.msg_id is not None:
            self.chat_store.delete_message(m.msg_id)  # its kept versions and its own pictures go with it
        self.transcript.messages.remove(m)
        self.transcript.render_now()

    def flip(self, index: int, step: int) -> None:
        """Show an earlier or later reply; the one shown is the one the next turn builds on."""
        m = self.transcript.messages[index]
        if self._is_streaming() or not m.flip(step):
            return
        if m.msg_id is not None:
            self.chat_store.update_message(m.msg_id, m.content, "done")
            m.status = "done"
        keep_versions(self.versions, m)
        self.transcript.render_now()
