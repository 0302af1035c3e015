"""The catalog of known models (and hub search results): size, quantization, license and whether it fits.

A size the catalog does not list is the hub's (filled in by the model manager when online) or an
estimate from parameters × bits per weight, shown with "~" and said so in its tooltip.
"""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QHBoxLayout, QHeaderView, QLabel, QLineEdit, QPushButton, QTableWidget,
                               QTableWidgetItem, QVBoxLayout, QWidget)

from app.catalog import BITS_PER_WEIGHT, Catalog, CatalogEntry, display_names
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


def size_cell(e: CatalogEntry) -> QTableWidgetItem:
    """The exact size when known, else "~estimate"; the tooltip says where the figure comes from."""
    if e.size_bytes:
        item = QTableWidgetItem(human_size(e.size_bytes))
        item.setToolTip("From the hub's metadata" if (e.notes or "").startswith("from the hub") else
                        "The file's size")
        return item
    est = e.estimated_size_bytes
    if est:
        item = QTableWidgetItem(f"~{human_size(est)}")
        item.setToolTip(f"Estimated: {e.parameters} parameters × {BITS_PER_WEIGHT.get(e.quantization)} bits per "
                        f"weight ({e.quantization}); the hub's exact size shows when Ember is online")
        return item
    item = QTableWidgetItem("unknown")
    item.setToolTip("Neither the catalog nor the hub gives a size, and the parameter count is unknown")
    return item


def fit_badge(advice: FitAdvice | None) -> QLabel:
    """A green "fits" or red "too big" label; the reason is the tooltip."""
    if advice is None:
        label = QLabel("size unknown")
        label.setProperty("badge", "unknown")
        label.setToolTip("Without a size there is no telling whether it fits; the download tells")
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
        self.hub_entries: list[CatalogEntry] = []  # the last hub search's results, listed after the catalog
        self.search = QLineEdit(self, placeholderText="Filter the catalog…", clearButtonEnabled=True)
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
        self._names: dict[str, str] = {}
        self.search.textChanged.connect(self.refresh)
        self.refresh()

    def entries(self) -> list[CatalogEntry]:
        query = self.search.text().strip()
        known = {e.id for e in self.catalog}
        return self.catalog.search(query) + [e for e in self.hub_entries if e.id not in known]

    def set_catalog(self, catalog: Catalog) -> None:
        """The same models with more facts (the hub's sizes and checksums)."""
        self.catalog = catalog
        self.refresh()

    def set_hub_entries(self, entries: list[CatalogEntry]) -> None:
        self.hub_entries = list(entries)
        self.refresh()

    def display_name(self, entry: CatalogEntry) -> str:
        return self._names.get(entry.id, entry.name)

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
        self._names = display_names([*self.catalog, *self.hub_entries])
        self.table.setRowCount(len(entries))
        for row, e in enumerate(entries):
            name = QTableWidgetItem(self._names.get(e.id, e.name))
            name.setToolTip(f"{e.id}\n{e.repo}\n{e.notes or ''}".strip())
            name.setData(Qt.UserRole, e.id)
            self.table.setItem(row, 0, name)
            self.table.setItem(row, 1, QTableWidgetItem(str(e.parameters)))
            self.table.setItem(row, 2, QTableWidgetItem(e.quantization if e.format == "gguf"
                                                        else f"{e.quantization} ({e.format})"))
            self.table.setItem(row, 3, size_cell(e))
            self.table.setItem(row, 4, QTableWidgetItem(e.license))
            has_size = bool(e.size_bytes or e.estimated_size_bytes)
            self.table.setCellWidget(row, 5, _centered(fit_badge(self._safe_advice(e) if has_size else None)))
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
