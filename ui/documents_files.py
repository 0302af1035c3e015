"""The files of one collection as a table: name, state in words (with a progress bar while it
indexes, the time left measured from its rate) and where it came from. Files dropped on it are
offered through `files_dropped`."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QProgressBar, QTableWidget, QTableWidgetItem, QWidget

from app.doc_sync import IndexClock, status_words
from ui.chat_documents import dropped_files

COLUMNS = ("File", "State", "Progress")
RED = "#c92a2a"


def file_name(f: dict) -> str:
    attrs = f.get("attributes") or {}
    return Path(str(attrs["path"])).name if attrs.get("path") else str(f.get("filename") or f["id"])


class FilesTable(QTableWidget):
    files_dropped = Signal(list)  # [Path]

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(0, len(COLUMNS), parent)
        self.setHorizontalHeaderLabels(COLUMNS)
        self.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.verticalHeader().hide()
        header = self.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.Interactive)
        header.setSectionResizeMode(1, QHeaderView.Stretch)
        header.setSectionResizeMode(2, QHeaderView.Fixed)
        self.setColumnWidth(0, 220)
        self.setColumnWidth(2, 140)
        self.setAcceptDrops(True)
        self.viewport().setAcceptDrops(True)
        self.clock = IndexClock()
        self.files: list[dict] = []

    def show_files(self, files: list[dict]) -> None:
        selected = set(self.selected_ids())
        self.files = files
        self.setRowCount(len(files))
        for row, f in enumerate(files):
            progress = f.get("progress") or {}
            done, total = int(progress.get("chunks_done") or 0), int(progress.get("chunks_total") or 0)
            indexing = f.get("status") == "in_progress"
            left = self.clock.seconds_left(f["id"], done, total) if indexing else None
            name = QTableWidgetItem(file_name(f))
            name.setData(Qt.UserRole, f["id"])
            name.setToolTip(str((f.get("attributes") or {}).get("path") or f["id"]))
            state = QTableWidgetItem(status_words(f, left))
            state.setToolTip(state.text())
            if f.get("status") == "failed":
                state.setForeground(QColor(RED))
            self.setItem(row, 0, name)
            self.setItem(row, 1, state)
            if indexing and total:
                self.setCellWidget(row, 2, self._bar(done, total))
            else:
                self.removeCellWidget(row, 2)
            if f["id"] in selected:
                self.selectRow(row)

    def _bar(self, done: int, total: int) -> QProgressBar:
        bar = QProgressBar(self)
        bar.setRange(0, total)
        bar.setValue(done)
        bar.setFormat("%p%")
        return bar

    def selected_ids(self) -> list[str]:
        rows = sorted({i.row() for i in self.selectedIndexes()})
        return [self.item(r, 0).data(Qt.UserRole) for r in rows if self.item(r, 0) is not None]

    def indexing(self) -> bool:
        return any(f.get("status") == "in_progress" for f in self.files)

    def dragEnterEvent(self, event) -> None:  # noqa: N802 - Qt name
        if dropped_files(event):
            event.acceptProposedAction()

    def dragMoveEvent(self, event) -> None:  # noqa: N802 - Qt name
        if dropped_files(event):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802 - Qt name
        if paths := dropped_files(event):
            event.acceptProposedAction()
            self.files_dropped.emit(paths)
