"""Search the model hub for GGUF models from the model manager (a line, a button, a status line).

The search and the file listings run in a worker (app.hub over huggingface_hub's HfApi); `found`
carries the downloadable entries, one per GGUF file, with the hub's sizes and sha256.
"""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QPushButton, QVBoxLayout, QWidget

from app.hub import search_hub_entries
from ui.elided_label import ElidedLabel
from ui.workers import FunctionWorker

class HubSearch(QWidget):
    """`found(list[CatalogEntry])` after a search; `cleared()` when the query is emptied."""

    found = Signal(list)
    cleared = Signal()

    def __init__(self, hub_base_url: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.hub_base_url = hub_base_url
        self._worker: FunctionWorker | None = None
        self.query = QLineEdit(self, placeholderText="Search Hugging Face for GGUF models (e.g. qwen coder)…",
                               clearButtonEnabled=True)
        self.button = QPushButton("Search the hub", self)
        self.status = ElidedLabel(parent=self)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(QLabel("Hub:", self))
        row.addWidget(self.query, 1)
        row.addWidget(self.button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.status)
        self.status.hide()
        self.button.clicked.connect(self.search)
        self.query.returnPressed.connect(self.search)
        self.query.textChanged.connect(self._on_text_changed)

    @property
    def busy(self) -> bool:
        return self._worker is not None and not self._worker.is_finished

    def search(self) -> FunctionWorker | None:
        text = self.query.text().strip()
        if not text:
            return None
        if self._worker is not None:  # one search at a time: the newest wins
            self._worker.quit()
        self._worker = FunctionWorker(search_hub_entries, self.hub_base_url, text)
        self._worker.returned.connect(self._on_returned)
        self._worker.errored.connect(self._on_errored)
        self._show(f"Searching {self.hub_base_url} for “{text}”…")
        self.button.setEnabled(False)
        self._worker.start()
        return self._worker

    def _is_current(self) -> bool:
        return self._worker is not None and self.sender() is self._worker.signals

    def _on_returned(self, entries: list) -> None:
        if not self._is_current():
            return
        self.button.setEnabled(True)
        self._show(f"{len(entries)} GGUF files on the hub for “{self.query.text().strip()}”" if entries
                   else "Nothing on the hub matches.")
        self.found.emit(entries)

    def _on_errored(self, error: Exception) -> None:
        if not self._is_current():
            return
        self.button.setEnabled(True)
        self._show(f"Hub search failed: {error}")
        self.status.setToolTip(str(error))

    def _on_text_changed(self, text: str) -> None:
        if not text.strip():
            self.status.hide()
            self.cleared.emit()

    def _show(self, text: str) -> None:
        self.status.setText(text)
        self.status.show()
