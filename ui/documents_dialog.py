"""Documents (Models → Documents…): the user's collections (OpenAI's vector stores, on the engine the
window talks to) and their files. Create, rename and delete a collection; add files (a file dialog, or
dropped on the list), see each one index with its progress and time left, remove one, and Sync (files
changed on disk are indexed again, files gone are removed). A chat's own collection is listed too.

Every request runs on a worker (ui/workers.py); the dialog only reacts to their signals."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (QDialog, QFileDialog, QHBoxLayout, QInputDialog, QLabel, QListWidget,
                               QListWidgetItem, QMessageBox, QPushButton, QSplitter, QVBoxLayout, QWidget)

from app.doc_sync import CHAT_KEY, add_files, delete_collection, named_files, remove_file, sync
from ui.documents_files import FilesTable
from ui.workers import FunctionWorker, GeneratorWorker, WorkerSet

POLL_MS = 1000
RED = "#c92a2a"


class DocumentsDialog(QDialog):
    """`collections_changed` after a collection was made, renamed or deleted (the chat panel lists them)."""

    collections_changed = Signal()

    def __init__(self, engine, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Documents")
        self.resize(920, 480)
        self.engine = engine
        self.workers = WorkerSet()
        self.stores: list[dict] = []
        self.collections = QListWidget(self)
        self.collections.setToolTip("Collections of files that chats can answer from")
        self.files = FilesTable(self)
        self.title = QLabel(self, textFormat=Qt.PlainText)
        font = self.title.font()
        font.setBold(True)
        self.title.setFont(font)
        self.message = QLabel(self, textFormat=Qt.PlainText, wordWrap=True)
        self.buttons: dict[str, QPushButton] = {}
        self._lay_out()
        self._poll = QTimer(self, singleShot=True, interval=POLL_MS)
        self._poll.timeout.connect(self.refresh_files)
        self.collections.currentItemChanged.connect(lambda *_: self.refresh_files())
        self.files.files_dropped.connect(self.add_paths)
        self.files.itemSelectionChanged.connect(self._enable)

    def _lay_out(self) -> None:
        left, right = QWidget(self), QWidget(self)
        lv, rv = QVBoxLayout(left), QVBoxLayout(right)
        lv.setContentsMargins(0, 0, 0, 0)
        rv.setContentsMargins(0, 0, 0, 0)
        lv.addWidget(QLabel("Collections", self))
        lv.addWidget(self.collections, 1)
        lv.addLayout(self._row(("New…", self.new_collection, "A new, empty collection"),
                               ("Rename…", self.rename_dialog, "Rename the collection"),
                               ("Delete", self.delete_dialog, "Delete the collection and its index")))
        rv.addWidget(self.title)
        rv.addWidget(self.files, 1)
        rv.addLayout(self._row(("Add files…", self.choose_files, "Add files (or drop them on the list)"),
                               ("Remove", self.remove_selected, "Remove the selected files from the collection"),
                               ("Sync", self.sync_collection, "Index again the files changed on disk since "
                                                              "they were added; remove those deleted")))
        split = QSplitter(self)
        split.addWidget(left)
        split.addWidget(right)
        split.setSizes([220, 700])
        layout = QVBoxLayout(self)
        layout.addWidget(split, 1)
        layout.addWidget(self.message)
        self._enable()

    def _row(self, *specs) -> QHBoxLayout:
        row = QHBoxLayout()
        for text, slot, tip in specs:
            b = self.buttons[text] = QPushButton(text, self)
            b.setToolTip(tip)
            b.clicked.connect(lambda *_, s=slot: s())
            row.addWidget(b)
        row.addStretch(1)
        return row

    def _enable(self) -> None:
        has = self.current_id() is not None
        for text in ("Rename…", "Delete", "Add files…", "Sync"):
            self.buttons[text].setEnabled(has)
        self.buttons["Remove"].setEnabled(has and bool(self.files.selected_ids()))

    # ---- collections ----
    def current_id(self) -> str | None:
        item = self.collections.currentItem()
        return item.data(Qt.UserRole) if item is not None else None

    def showEvent(self, event) -> None:  # noqa: N802 - Qt name
        super().showEvent(event)
        self.refresh()

    def refresh(self, select: str | None = None) -> None:
        self._call(lambda c: c.vector_stores(), lambda stores: self._show_stores(stores, select))

    def _show_stores(self, stores: list[dict], select: str | None) -> None:
        current = select or self.current_id()
        self.stores = stores
        self.collections.blockSignals(True)
        self.collections.clear()
        for s in stores:
            item = QListWidgetItem(s.get("name") or s["id"])
            item.setData(Qt.UserRole, s["id"])
            counts = s.get("file_counts") or {}
            own = CHAT_KEY in (s.get("metadata") or {})
            item.setToolTip(f"{counts.get('total', 0)} files" + (" · this chat's own files" if own else ""))
            if own:
                font = QFont(item.font())
                font.setItalic(True)
                item.setFont(font)
            self.collections.addItem(item)
            if s["id"] == current:
                self.collections.setCurrentItem(item)
        if self.collections.currentItem() is None and self.collections.count():
            self.collections.setCurrentRow(0)
        self.collections.blockSignals(False)
        self.refresh_files()

    def new_collection(self) -> None:
        name, ok = QInputDialog.getText(self, "New collection", "Name:")
        if ok and name.strip():
            self.create_collection(name.strip())

    def create_collection(self, name: str) -> None:
        self._call(lambda c: c.create_vector_store(name), lambda s: self._changed(s["id"]))

    def rename_dialog(self) -> None:
        item = self.collections.currentItem()
        if item is not None:
            name, ok = QInputDialog.getText(self, "Rename collection", "Name:", text=item.text())
            if ok and name.strip():
                self.rename_collection(name.strip())

    def rename_collection(self, name: str) -> None:
        store_id = self.current_id()
        self._call(lambda c: c.rename_vector_store(store_id, name), lambda _s: self._changed(store_id))

    def delete_dialog(self) -> None:
        item = self.collections.currentItem()
        if item is not None and QMessageBox.question(
                self, "Delete collection", f"Delete “{item.text()}” and its index? The files on disk stay.") \
                == QMessageBox.Yes:
            self.delete_current()

    def delete_current(self) -> None:
        store_id = self.current_id()
        self._call(lambda c: delete_collection(c, store_id), lambda _r: self._changed(None))

    def _changed(self, select: str | None) -> None:
        self.refresh(select)
        self.collections_changed.emit()

    # ---- files ----
    def refresh_files(self) -> None:
        store_id = self.current_id()
        name = self.collections.currentItem().text() if store_id else ""
        self.title.setText(name or "No collection: make one with New…")
        self._enable()
        if store_id is None:
            self.files.show_files([])
            return
        self._call(lambda c: named_files(c, store_id), lambda files: self._show_files(store_id, files))

    def _show_files(self, store_id: str, files: list[dict]) -> None:
        if store_id != self.current_id():
            return  # another collection was chosen meanwhile
        self.files.show_files(files)
        self._enable()
        if self.files.indexing() and self.isVisible():
            self._poll.start()

    def choose_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Add files to the collection")
        if paths:
            self.add_paths([Path(p) for p in paths])

    def add_paths(self, paths: list[Path]) -> None:
        store_id, client = self.current_id(), self.engine.client()
        if store_id is None or client is None:
            self._say("Choose a collection first (New… makes one)." if client else "The engine is not running.")
            return
        self._say(f"Adding {len(paths)} file{'s' if len(paths) > 1 else ''}…", error=False)
        failed: list[str] = []
        self.workers.run(GeneratorWorker(add_files, client, store_id, paths),
                         yielded=lambda r: r[1] and failed.append(f"{Path(r[0]).name}: {r[1]}"),
                         finished=lambda: (self._say("; ".join(failed)) if failed else self._say(""),
                                           self.refresh_files()))

    def remove_selected(self) -> None:
        store_id, ids = self.current_id(), self.files.selected_ids()
        self._call(lambda c: [remove_file(c, store_id, i) for i in ids], lambda _r: self.refresh_files())

    def sync_collection(self) -> None:
        store_id = self.current_id()
        self._say("Syncing…", error=False)
        self._call(lambda c: sync(c, store_id), self._on_synced)

    def _on_synced(self, result: dict) -> None:
        changed, removed = result["changed"], result["removed"]
        self._say(f"Synced: {changed} changed file{'s' * (changed != 1)} indexed again, {removed} removed."
                  if changed or removed else "Synced: every file is as it was indexed.", error=False)
        self.refresh_files()

    # ---- plumbing ----
    def _call(self, work, done) -> None:
        """`work(client)` on a worker, then `done(result)` here; a failure is said under the lists."""
        client = self.engine.client()
        if client is None:
            self._say("The engine is not running: start it from the Engine menu.")
            return
        self.workers.run(FunctionWorker(work, client), returned=done, errored=lambda e: self._say(str(e)))

    def _say(self, text: str, error: bool = True) -> None:
        self.message.setStyleSheet(f"color: {RED}" if error and text else "")
        self.message.setText(text)
