"""Re-emits DownloadManager events (called on its worker threads) as a Qt signal on the GUI thread."""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app.download_jobs import DownloadEvent
from app.downloads import DownloadManager
from ui.gui_thread import gui_calls


class DownloadBridge(QObject):
    """`event(DownloadEvent)` is emitted on the GUI thread, in the order the downloads sent them."""

    event = Signal(object)

    def __init__(self, downloads: DownloadManager, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._alive = True
        self._gui = gui_calls()
        self._unsubscribe = downloads.subscribe(self._from_worker)

    def _from_worker(self, event: DownloadEvent) -> None:  # runs on a download thread: no widgets here
        self._gui.post(self._on_gui_thread, event)  # never a Qt call here: see ui/gui_thread.py

    def _on_gui_thread(self, event: DownloadEvent) -> None:
        if self._alive:
            self.event.emit(event)

    def close(self) -> None:
        """Stop listening (the manager outlives this bridge)."""
        self._alive = False
        self._unsubscribe()
