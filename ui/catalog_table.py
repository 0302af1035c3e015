"""The catalog of known models: size, quantization, license and whether it fits this machine."""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QHBoxLayout, QHeaderView, QLabel, QLineEdit, QPushButton, QTableWidget,
                               QTableWidgetItem, QVBoxLayout, QWidget)

from app.catalog import Catalog, CatalogEntry
from app.fit import FitAdvice

COLUMNS = ("Model", "Parameters", "Quantization", "Size", "License", "This machine", "")


def human_size(n: int | None) -> str:
    if not n:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def fit_badge(advice: FitAdvice | None) -> QLabel:
    """A green "fits" or red "too big" label; the reason is the tooltip."""
    if advice is None:
        label = QLabel("size unknown")
        label.setProperty("badge", "unknown")
        label.setToolTip("The catalog does not list this model's size; the download tells")
    else:
        fits = advice.fits
        text = "fits" if fits else "too big"
        ctx = advice.max_context
        if fits and ctx:
            text += f" · {ctx // 1024}k ctx" if ctx >= 1024 else f" · {ctx} ctx"
        label = QLabel(text)
        label.setProperty("badge", "fits" if fits else "nofit")
        label.setToolTip(advice.reason)
    label.setAlignment(Qt.AlignCenter)
    return label


def _centered(widget: QWidget) -> QWidget:
    """A cell holder that keeps a badge pill-sized instead of stretched over the cell."""
    holder = QWidget()
    row = QHBoxLayout(holder)
    row.setContentsMargins(4, 2, 4, 2)
    row.addWidget(widget, 0, Qt.AlignCenter)
    return holder


class CatalogTable(QWidget):
    """`download_requested(entry)` when the user asks for one; `advise(entry)` gives FitAdvice."""

    download_requested = Signal(object)

    def __init__(self, catalog: Catalog, advise: Callable[[CatalogEntry], FitAdvice] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.catalog = catalog
        self._advise = advise
        self.search = QLineEdit(self, placeholderText="Search the catalog…", clearButtonEnabled=True)
        self.table = QTableWidget(0, len(COLUMNS), self)
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.setSelectionBehavior(QTableWidget.SelectRows)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.Stretch)
        layout = QVBoxLayout(self)
        layout.addWidget(self.search)
        layout.addWidget(self.table)
        self.installed_ids: set[str] = set()
        self.search.textChanged.connect(self.refresh)
        self.refresh()

    def entries(self) -> list[CatalogEntry]:
        query = self.search.text().strip()
        return self.catalog.search(query)

    def set_installed(self, ids: set[str]) -> None:
        """Update the Download/Installed buttons in place."""
        self.installed_ids = set(ids)
        for row in range(self.table.rowCount()):
            model_id = self.table.item(row, 0).data(Qt.UserRole)
            button = self.table.cellWidget(row, 6)
            installed = model_id in self.installed_ids
            button.setText("Installed" if installed else "Download")
            button.setEnabled(not installed)

    def refresh(self) -> None:
        entries = self.entries()
        self.table.setRowCount(len(entries))
        for row, e in enumerate(entries):
            name = QTableWidgetItem(e.name)
            name.setToolTip(f"{e.id}\n{e.notes or ''}".strip())
            name.setData(Qt.UserRole, e.id)
            self.table.setItem(row, 0, name)
            self.table.setItem(row, 1, QTableWidgetItem(str(e.parameters)))
            self.table.setItem(row, 2, QTableWidgetItem(f"{e.quantization} ({e.format})"))
            self.table.setItem(row, 3, QTableWidgetItem(human_size(e.size_bytes)))
            self.table.setItem(row, 4, QTableWidgetItem(e.license))
            self.table.setCellWidget(row, 5, _centered(fit_badge(self._safe_advice(e) if e.size_bytes else None)))
            installed = e.id in self.installed_ids
            button = QPushButton("Installed" if installed else "Download")
            button.setEnabled(not installed)
            button.clicked.connect(lambda _=False, entry=e: self.download_requested.emit(entry))
            self.table.setCellWidget(row, 6, button)

    def button_for(self, model_id: str) -> QPushButton | None:
        for row in range(self.table.rowCount()):
            if self.table.item(row, 0).data(Qt.UserRole) == model_id:
                return self.table.cellWidget(row, 6)
        return None

    def _safe_advice(self, entry: CatalogEntry) -> FitAdvice | None:
        if self._advise is None:
            return None
        try:
            return self._advise(entry)
        except Exception:  # advice is a hint; a bad entry must not break the table
            return None
