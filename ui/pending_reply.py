"""A reply that has not begun says what it waits for: memory to load its model ("Waiting for memory:
1 ahead"), or the load itself ("Loading Qwen 0.5B…"). It reads each polled status and keeps the
controller's poll on the short interval while it waits."""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject

from ui.engine_controller import EngineController
from ui.resident_models import pending_words
from ui.transcript_message import TranscriptMessage


class PendingReply(QObject):
    """One per chat view; `watch` a reply when it is sent, `stop` when it ends (its first token ends it too)."""

    def __init__(self, engine: EngineController, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.engine = engine
        self._reply: TranscriptMessage | None = None
        self._model: str | None = None
        self._render: Callable[[], None] = lambda: None
        engine.status_changed.connect(self._on_status)

    def watch(self, reply: TranscriptMessage, model: str | None, render: Callable[[], None]) -> None:
        self._reply, self._model, self._render = reply, model, render
        self.engine.keep_polling(self, True)

    def stop(self) -> None:
        if self._reply is not None:
            self._reply.pending = ""
        self._reply = None
        self.engine.keep_polling(self, False)

    def _on_status(self, status: dict) -> None:
        reply = self._reply
        if reply is None:
            return
        if reply.status != "streaming" or reply.content or reply.reasoning or reply.tool_calls or reply.steps:
            self.stop()  # it began (or ended): its own text shows now
            return
        words = pending_words(status, self._model, self.engine.model_names)
        if words != reply.pending:
            reply.pending = words
            self._render()
