"""The chat panel's Documents: which named collections this chat answers from (the chat's
`documents_collections`); its own files (attached to the chat) are always searched. The list comes
from the engine on a worker; "Manage…" opens the Documents view."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QGroupBox, QLabel, QListWidget, QListWidgetItem, QPushButton, QVBoxLayout, QWidget

from app.doc_sync import CHAT_KEY
from ui.chat_documents import COLLECTIONS_KEY
from ui.chat_tools_section import GREY
from ui.workers import FunctionWorker, WorkerSet


class ChatDocumentsSection(QGroupBox):
    """`changed(dict)`: the chat settings to merge; `manage_requested`: open the Documents view."""

    changed = Signal(dict)
    manage_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Documents", parent)
        self.engine = None
        self.workers = WorkerSet()
        self._chosen: list[str] = []
        self._loading = False
        self.list = QListWidget(self)
        self.list.setMaximumHeight(90)
        palette = self.list.palette()  # checkbox outlines that show on the dark theme (as ui/chat_tools_section.py)
        palette.setColor(QPalette.Window, QColor(GREY))
        self.list.setPalette(palette)
        self.list.setToolTip("Tick the collections this chat answers from; the chat's own files (Files…) "
                             "are always used")
        self.note = QLabel(self, wordWrap=True, textFormat=Qt.PlainText)
        self.manage = QPushButton("Manage…", self)
        self.manage.setToolTip("Documents: make collections and add files to them")
        self.manage.clicked.connect(self.manage_requested)
        layout = QVBoxLayout(self)
        layout.addWidget(self.list)
        layout.addWidget(self.note)
        layout.addWidget(self.manage, 0, Qt.AlignLeft)
        self.list.itemChanged.connect(self._on_item_changed)
        self.setVisible(False)  # until the app hands it the engine

    def set_engine(self, engine) -> None:
        self.engine = engine
        self.setVisible(True)
        self.refresh()

    def load(self, chat_settings: dict) -> None:
        self._chosen = list((chat_settings or {}).get(COLLECTIONS_KEY) or [])
        self._tick()

    def values(self) -> dict:
        return {COLLECTIONS_KEY: list(self._chosen) or None}

    def refresh(self) -> None:
        """List the named collections again (a worker)."""
        client = self.engine.client() if self.engine is not None else None
        if client is None:
            self._show([])
            return
        worker = FunctionWorker(client.vector_stores)
        self.workers.run(worker, returned=self._show, errored=lambda _e: self._show([]))

    def _show(self, stores: list[dict]) -> None:
        self._loading = True
        self.list.clear()
        for s in stores:
            if CHAT_KEY in (s.get("metadata") or {}):
                continue  # a chat's own files: not offered to other chats
            item = QListWidgetItem(s.get("name") or s["id"])
            item.setData(Qt.UserRole, s["id"])
            item.setFlags(item.flags() | Qt.ItemIsUserCheckable)
            self.list.addItem(item)
        self._loading = False
        listed = {self.list.item(i).data(Qt.UserRole) for i in range(self.list.count())}
        if self.engine is not None and self._chosen and not set(self._chosen) <= listed and stores:
            self._chosen = [s for s in self._chosen if s in listed]  # deleted in the Documents view
            self.changed.emit(self.values())
        self._tick()
        self.note.setText("" if self.list.count() else "No collections yet: Manage… makes one.")
        self.note.setVisible(not self.list.count())
        self.list.setVisible(bool(self.list.count()))  # the panel stays short on a small screen

    def _tick(self) -> None:
        self._loading = True
        for i in range(self.list.count()):
            item = self.list.item(i)
            item.setCheckState(Qt.Checked if item.data(Qt.UserRole) in self._chosen else Qt.Unchecked)
        self._loading = False

    def _on_item_changed(self, item: QListWidgetItem) -> None:
        if self._loading:
            return
        store_id = item.data(Qt.UserRole)
        self._chosen = [s for s in self._chosen if s != store_id]
        if item.checkState() == Qt.Checked:
            self._chosen.append(store_id)
        self.changed.emit(self.values())
