"""The model manager: catalog (with fit badges and hub search), downloads, and installed models, as three tabs.

When it opens, a worker asks the hub (huggingface_hub's HfApi) for the sizes and checksums the
catalog does not list; offline, the catalog keeps its estimates and says so.
"""
from __future__ import annotations

from collections.abc import Callable

from dataclasses import replace

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QTabWidget, QVBoxLayout, QWidget

from app.catalog import Catalog, CatalogEntry
from app.download_jobs import JobState
from app.downloads import DownloadManager
from app.fit import FitAdvice
from app.hub import with_hub_facts
from app.settings import Settings
from app.store import ModelStore
from ui.catalog_table import CatalogTable
from ui.download_bridge import DownloadBridge
from ui.downloads_panel import DownloadsPanel
from ui.elided_label import ElidedLabel
from ui.hub_search import HubSearch
from ui.installed_table import InstalledTable
from ui.workers import FunctionWorker


class ModelManagerDialog(QDialog):
    """Non-modal; downloads keep running when it is closed (the DownloadManager owns them).

    `advise(entry) -> FitAdvice` comes from app.fit; `model_installed(id)` after a download lands.
    """

    model_installed = Signal(str)
    store_changed = Signal()  # a model was added (download, import) or removed

    def __init__(self, store: ModelStore, catalog: Catalog, downloads: DownloadManager | None, settings: Settings,
                 advise: Callable[[CatalogEntry], FitAdvice] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.resize(900, 520)
        self.store = store
        self.downloads = downloads
        self.catalog_table = CatalogTable(catalog, advise, self)
        self.hub_search = HubSearch(settings.hub_base_url, self)
        self.hub_status = ElidedLabel(parent=self, objectName="hubStatus")
        catalog_tab = QWidget(self)
        catalog_layout = QVBoxLayout(catalog_tab)
        catalog_layout.addWidget(self.hub_search)
        catalog_layout.addWidget(self.catalog_table, 1)
        catalog_layout.addWidget(self.hub_status)
        self.installed = InstalledTable(store, settings, self)
        self.tabs = QTabWidget(self)
        self.tabs.addTab(catalog_tab, "Catalog")
        self.hub_search.found.connect(self.catalog_table.set_hub_entries)
        self.hub_search.cleared.connect(lambda: self.catalog_table.set_hub_entries([]))
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
        self._facts_worker: FunctionWorker | None = None
        self.fetch_hub_facts(settings.hub_base_url)

    def fetch_hub_facts(self, hub_base_url: str) -> FunctionWorker:
        """Sizes and sha256 from the hub for the entries that lack them (a worker; offline keeps estimates)."""
        self.hub_status.setText("Asking the hub for exact sizes…")
        self._facts_worker = FunctionWorker(with_hub_facts, hub_base_url, list(self.catalog_table.catalog))
        self._facts_worker.returned.connect(self._on_hub_facts)
        self._facts_worker.errored.connect(self._on_hub_facts_failed)
        self._facts_worker.start()
        return self._facts_worker

    def _on_hub_facts(self, entries: list) -> None:
        before = sum(1 for e in self.catalog_table.catalog if e.size_bytes)
        self.catalog_table.set_catalog(Catalog(entries))
        filled = sum(1 for e in entries if e.size_bytes) - before
        left = sum(1 for e in entries if not e.size_bytes)
        self.hub_status.setText(f"Exact sizes from the hub for {filled} model{'s' if filled != 1 else ''}" +
                                (f"; sizes marked ~ are estimates ({left})." if left else "."))

    def _on_hub_facts_failed(self, error: Exception) -> None:
        self.hub_status.setText(f"Sizes marked ~ are estimates (parameters × bits per weight): {error}")
        self.hub_status.setToolTip(str(error))

    def start_download(self, entry: CatalogEntry) -> str | None:
        assert self.downloads_panel is not None, "no DownloadManager was given"
        # the name on every row (downloads, installed, the chat's picker): one that tells quantizations apart
        entry = replace(entry, name=self.catalog_table.display_name(entry))
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
        self.store_changed.emit()
