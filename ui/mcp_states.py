"""The MCP servers' state changes as a Qt signal on the GUI thread.

ChatTools reports each server's new ServerState from the host's event-loop thread; Settings -> Tools
and the chat panel redraw from `changed`. The report only queues (ui.gui_thread): no Qt on that thread.
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app.agent.mcp_connection import ServerState
from ui.gui_thread import gui_calls


class ServerStates(QObject):
    """Pass `report` as ChatTools' `on_change`; connect to `changed(ServerState)`."""

    changed = Signal(object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._calls = gui_calls()  # made here, on the GUI thread, before any report can come

    def report(self, state: ServerState) -> None:
        """Any thread: touches no Qt object here (the signal is emitted on the GUI thread)."""
        self._calls.post(self._emit, state)

    def _emit(self, state: ServerState) -> None:
        self.changed.emit(state)
