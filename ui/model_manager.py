"""The model manager: catalog (with fit badges), downloads, and installed models, as three tabs."""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QTabWidget, QVBoxLayout, QWidget

from app.catalog import Catalog, CatalogEntry
from app.download_jobs import JobState
from app.downloads import DownloadManager
from app.fit import FitAdvice
from app.settings import Settings
from app.store import ModelStore
from ui.catalog_table import CatalogTable
from ui.download_bridge import DownloadBridge
from ui.downloads_panel import DownloadsPanel
from ui.installed_table import InstalledTable


class ModelManagerDialog(QDialog):
    """Non-modal; downloads keep running when it is closed (the DownloadManager owns them).

    `advise(entry) -> FitAdvice` comes from app.fit; `model_installed(id)` after a download lands.
    """

    model_installed = Signal(str)

    def __init__(self, store: ModelStore, catalog: Catalog, downloads: DownloadManager | None, settings: Settings,
                 advise: Callable[[CatalogEntry], FitAdvice] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.resize(900, 520)
        self.store = store
        self.downloads = downloads
        self.catalog_table = CatalogTable(catalog, advise, self)
        self.installed = InstalledTable(store, settings, self)
        self.tabs = QTabWidget(self)
        self.tabs.addTab(self.catalog_table, "Catalog")
        self.downloads_panel: DownloadsPanel | None = None
        if downloads is not None:
            self.bridge = DownloadBridge(downloads, self)
            self.downloads_panel = DownloadsPanel(downloads, self.bridge, self)
            self.tabs.addTab(self.downloads_panel, "Downloads")
            self.downloads_panel.finished.connect(self._on_download_finished)
            self.catalog_table.download_requested.connect(self._on_download_requested)
        else:
            self.catalog_table.download_requested.connect(lambda _e: None)
        self.tabs.addTab(self.installed, "Installed")
        buttons = QDialogButtonBox(QDialogButtonBox.Close, self)
        buttons.rejected.connect(self.close)
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs)
        layout.addWidget(buttons)
        self.installed.changed.connect(self._on_installed_changed)
        self._on_installed_changed()

    def start_download(self, entry: CatalogEntry) -> str | None:
        assert self.downloads_panel is not None, "no DownloadManager was given"
        job_id = self.downloads_panel.start(entry)
        self.tabs.setCurrentWidget(self.downloads_panel)
        return job_id

    def _on_download_requested(self, entry: CatalogEntry) -> None:
        self.start_download(entry)

    def _on_download_finished(self, _job_id: str, state: str) -> None:
        if state == JobState.DONE:
            before = set(self.installed.model_ids())
            self.installed.refresh()
            self._on_installed_changed()
            for model_id in set(self.installed.model_ids()) - before:
                self.model_installed.emit(model_id)

    def _on_installed_changed(self) -> None:
        self.catalog_table.set_installed({m.id for m in self.store.list()})
