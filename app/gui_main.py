"""`ember` with no command: the desktop app. The only module of `app` that imports Qt.

It parses nothing of its own, builds the objects (settings, stores, supervisor, controller,
window, tray), wires them together and runs the event loop; the widgets live in `ui`.
"""
from __future__ import annotations

import logging
import logging.handlers
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QSystemTrayIcon, QWidget

from app.agent.chat_tools import ChatTools, config_path
from app.catalog import Catalog
from app.embedders import embedding_models
from app.history import ChatStore
from app.model_kind import COMPLETION, is_completion_model
from app.reply_versions import ReplyVersions
from app.sampling_defaults import store_defaults
from app.settings import Settings
from app.store import ModelStore
from app.supervisor import EngineSupervisor
from ui.crash_dialog import CrashReporter
from ui.documents_dialog import DocumentsDialog
from ui.engine_controller import EngineController
from ui.main_window import MainWindow
from ui.mcp_states import ServerStates
from ui.model_manager import ModelManagerDialog
from ui.resources import apply_theme, icon
from ui.settings_dialog import SettingsDialog
from ui.single_instance import SingleInstance, instance_key
from ui.tray import TrayIcon

log = logging.getLogger("ember")

ENGINE_FIELDS = ("server_port", "ollama_port", "ollama_keyless", "api_key", "backend", "device", "dtype",
                 "kv_memory_fraction", "threads", "models_dir", "server_host", "speculative",
                 "memory_budget_gb", "max_loaded_models", "keep_alive", "kv_disk_gib", "embedding_model",
                 "fetch_image_urls")


@dataclass
class EmberApp:
    """Everything the GUI is made of, wired together; tests build one without running exec()."""

    settings: Settings
    chat_store: ChatStore
    store: ModelStore
    controller: EngineController
    window: MainWindow
    tray: TrayIcon
    catalog: Any = None
    downloads: Any = None
    model_manager: ModelManagerDialog | None = None
    settings_dialog: SettingsDialog | None = None
    chat_tools: ChatTools | None = None  # the MCP servers (mcp.json); their processes end with close_tools()
    tool_states: ServerStates | None = None
    documents: DocumentsDialog | None = None

    def open_documents(self, parent: QWidget | None = None) -> DocumentsDialog:
        """The Documents view (collections and their files), one for the app."""
        if self.documents is None:
            self.documents = DocumentsDialog(self.controller, self.window)
            self.documents.collections_changed.connect(self.window.settings_panel.documents.refresh)
        self.documents.show()
        self.documents.raise_()
        return self.documents

    def open_model_manager(self, parent: QWidget | None = None) -> ModelManagerDialog:
        if self.model_manager is None:
            catalog = self.catalog or Catalog([])  # build_app falls back to [] when the catalog cannot load
            self.model_manager = ModelManagerDialog(self.store, catalog, self.downloads, self.settings,
                                                    advise=_advisor(), parent=self.window)
            self.model_manager.model_installed.connect(lambda _id: self.controller.refresh_models())
            self.model_manager.store_changed.connect(self._on_store_changed)
            installed = self.model_manager.installed
            installed.load_requested.connect(self.controller.load_model)
            installed.unload_requested.connect(self.controller.unload_model)
            self.controller.load_finished.connect(installed.on_load_finished)
            self.controller.unload_finished.connect(installed.on_unload_finished)
            self.controller.status_changed.connect(installed.show_status)  # every loaded model marked
            installed.show_status(self.controller.last_status)
        self.model_manager.show()
        self.model_manager.raise_()
        return self.model_manager

    def _on_store_changed(self) -> None:
        """A model was imported, downloaded or deleted: the chat's picker shows it now."""
        self.window.refresh_model_picker()
        self.controller.refresh_models()

    def open_settings(self, parent: QWidget | None = None) -> SettingsDialog:
        before = {f: getattr(self.settings, f) for f in (*ENGINE_FIELDS, "connection_url", "connection_key")}
        dialog = SettingsDialog(self.settings, self.window, models=[(m.id, m.name) for m in self.store.list()],
                                engine_status=self.controller.last_status, tools=self.chat_tools,
                                tool_states=self.tool_states, show_log=self.window.show_engine_log,
                                embedders=embedding_models(self.store))
        self.controller.status_changed.connect(dialog.memory.show_status)  # the loaded model's figures, live
        dialog.settings_saved.connect(lambda s: self._on_settings_saved(before))
        dialog.open()  # window-modal, does not block the event loop
        self.settings_dialog = dialog
        return dialog

    def open_tools_settings(self) -> SettingsDialog:
        dialog = self.open_settings(self.window)
        dialog.tabs.setCurrentWidget(dialog.tools_page)
        return dialog

    def shutdown(self) -> None:
        """After the event loop: stop the engine and the MCP servers (their processes end), close the store."""
        self.window.save_geometry()  # Quit (menu, tray, signal) closes no window: remember its size here
        self.controller.shutdown()
        if self.chat_tools is not None:
            self.chat_tools.close()
        self.chat_store.close()

    def show_window(self) -> None:
        self.window.showNormal()
        self.window.raise_()
        self.window.activateWindow()

    def _on_settings_saved(self, before: dict) -> None:
        app = QApplication.instance()
        if app is not None:
            apply_theme(app, self.settings.theme)
        if any(before[f] != getattr(self.settings, f) for f in ("connection_url", "connection_key")):
            self.controller.apply_connection()
        elif any(before[f] != getattr(self.settings, f) for f in ENGINE_FIELDS) and not self.controller.is_remote:
            # short: the status bar's figures leave the message about half the window's width
            self.window.status.showMessage("Engine → Restart engine applies the new settings.", 10000)


def _advisor():
    """entry -> FitAdvice for this machine (RAM from psutil; no torch import on the GUI's path)."""
    from app.fit import fit_advice, probe_host

    machine = probe_host()
    return lambda entry: fit_advice(entry.size_bytes, entry, machine)


def build_app(settings: Settings, supervisor: Any | None = None, downloads: Any | None = None,
              poll_interval_ms: int = 1000) -> EmberApp:
    """Build and wire the app's objects (no window shown, the engine not started yet)."""
    settings.ensure_dirs()
    store = ModelStore(settings.models_dir)
    try:
        store.ensure_default()
    except Exception:  # the app still works with imported/downloaded models
        log.exception("could not register the bundled model")
    chat_store = ChatStore(settings.history_path)
    if supervisor is None:  # also when remote: the user may switch back to the local engine
        supervisor = EngineSupervisor(settings)
    controller = EngineController(settings, supervisor, poll_interval_ms=poll_interval_ms)
    try:
        catalog = Catalog.load(hub_base_url=settings.hub_base_url)
    except Exception:
        log.exception("could not load the model catalog")
        catalog = []
    if downloads is None:
        try:
            from app.downloads import DownloadManager

            downloads = DownloadManager(store, settings.data_dir / "downloads", settings.hub_base_url,
                                        max_parallel=settings.max_parallel_downloads)
        except Exception:
            log.exception("downloads are unavailable")
    parts: dict[str, Any] = {}
    tool_states = ServerStates()
    chat_tools = ChatTools(config_path(settings), on_change=tool_states.report)  # a broken file: its .error
    window = MainWindow(settings, chat_store, controller,
                        open_model_manager=lambda parent: parts["app"].open_model_manager(parent),
                        open_settings=lambda parent: parts["app"].open_settings(parent),
                        model_defaults=store_defaults(store),
                        local_models=lambda: [(m.id, _picker_name(store, m)) for m in store.list()],
                        reply_versions=ReplyVersions(settings.history_path), tools=chat_tools,
                        open_documents=lambda parent: parts["app"].open_documents(parent))
    window.settings_panel.tools.set_tools(chat_tools, tool_states)
    window.settings_panel.tools.configure_requested.connect(lambda: parts["app"].open_tools_settings())
    window.settings_panel.documents.set_engine(controller)
    window.settings_panel.documents.manage_requested.connect(lambda: parts["app"].open_documents())
    controller.models_changed.connect(window.settings_panel.documents.refresh)  # the engine (re)started
    tray = TrayIcon(controller, save_settings=settings.save)
    window.tray = tray
    ember = EmberApp(settings, chat_store, store, controller, window, tray, catalog, downloads,
                     chat_tools=chat_tools, tool_states=tool_states)
    parts["app"] = ember
    controller.show_window_requested.connect(ember.show_window)
    window.hidden_to_tray.connect(tray.on_window_hidden)
    return ember


def _setup_logging(settings: Settings) -> Path:
    settings.logs_dir.mkdir(parents=True, exist_ok=True)
    path = settings.logs_dir / "ember.log"
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=2 << 20, backupCount=3, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(min(logging.getLogger().level or logging.INFO, logging.INFO))
    for noisy in ("httpx", "httpx2"):  # a line per status poll (1 a second); httpx2: huggingface_hub's
        if logging.getLogger(noisy).getEffectiveLevel() < logging.WARNING and not _verbose():
            logging.getLogger(noisy).setLevel(logging.WARNING)
    return path


def _verbose() -> bool:
    return logging.getLogger().getEffectiveLevel() <= logging.DEBUG


def _picker_name(store: ModelStore, m) -> str:
    """A model's name in the chat's picker, marked when it is a base model (text completion)."""
    completion = is_completion_model(m.path, store.chat_template(m.id) is not None)
    return f"{m.name} · {COMPLETION}" if completion else m.name


def _quit_on_signals(app: QApplication, quit_app: Callable[[], None]) -> None:
    """SIGTERM/SIGINT quit through the event loop, so the engine child is stopped, not orphaned.

    Python runs signal handlers only between bytecodes; an idle timer gives it that chance while
    Qt's loop sits in C++.
    """
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: quit_app())
    timer = QTimer(app)
    timer.timeout.connect(lambda: None)
    timer.start(250)


def main(argv: list[str] | None = None) -> int:
    """Run the desktop app; a second launch raises the first window and returns 0 at once."""
    settings = Settings.load()
    log_path = _setup_logging(settings)
    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "ember"])
    app.setApplicationName("Ember")
    app.setDesktopFileName("io.github.ember.Ember")
    app.setWindowIcon(icon("ember"))
    app.setQuitOnLastWindowClosed(False)  # closing the window may leave the tray serving

    instance = SingleInstance(instance_key(os.environ.get("EMBER_HOME") or str(settings.path)))
    if not instance.acquire():
        log.info("Ember is already running; asked it to show its window")
        return 0
    crash = CrashReporter(log_path)
    crash.install()
    apply_theme(app, settings.theme)

    ember = build_app(settings)
    instance.activated.connect(ember.show_window)
    instance.activated.connect(lambda: log.info("another launch asked to show the window"))
    _quit_on_signals(app, ember.controller.request_quit)
    ember.controller.quit_requested.connect(app.quit)
    if QSystemTrayIcon.isSystemTrayAvailable():
        ember.tray.show()
    ember.window.show()
    ember.controller.start()
    try:
        return int(app.exec())
    finally:
        ember.shutdown()
        instance.release()
        crash.uninstall()
