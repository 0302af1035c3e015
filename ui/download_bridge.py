"""Re-emits DownloadManager events (called on its worker threads) as a Qt signal on the GUI thread."""
from __future__ import annotations

from PySide6.QtCore import QObject, Qt, Signal

from app.download_jobs import DownloadEvent
from app.downloads import DownloadManager


class DownloadBridge(QObject):
    """`event(DownloadEvent)` is delivered to GUI-thread receivers by queued connection."""

    event = Signal(object)
    _incoming = Signal(object)

    def __init__(self, downloads: DownloadManager, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._alive = True
        # emitted from a download thread, handled on this object's (the GUI) thread
        self._incoming.connect(self._on_incoming, Qt.QueuedConnection)
        self._unsubscribe = downloads.subscribe(self._from_worker)

    def _from_worker(self, event: DownloadEvent) -> None:  # runs on a download thread: no widgets here
        if self._alive:
            self._incoming.emit(event)

    def _on_incoming(self, event: DownloadEvent) -> None:
        self.event.emit(event)

    def close(self) -> None:
        """Stop listening (the manager outlives this bridge)."""
        self._alive = False
        self._unsubscribe()
