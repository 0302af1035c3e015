"""The main window: chat list | open chat | chat settings, with menus and the engine status bar.

Each opened chat keeps its ChatView (and its stream) alive while another chat is shown, so
several chats stream at once.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (QFileDialog, QLabel, QMainWindow, QMessageBox, QSplitter,
                               QStackedWidget, QWidget)

from app.history import ChatStore
from app.settings import Settings
from ui.chat_list import ChatListPanel
from ui.chat_settings_panel import ChatSettingsPanel
from ui.chat_view import ChatView
from ui.engine_controller import EngineController
from ui.resources import icon
from ui.status_bar import EngineStatusBar
from ui.tray import TrayIcon

log = logging.getLogger(__name__)


class MainWindow(QMainWindow):
    """`hidden_to_tray` fires when closing only hid the window (the engine keeps serving)."""

    hidden_to_tray = Signal()

    def __init__(self, settings: Settings, chat_store: ChatStore, engine: EngineController,
                 open_model_manager: Callable[[QWidget], None] | None = None,
                 open_settings: Callable[[QWidget], None] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.chat_store = chat_store
        self.engine = engine
        self.tray: TrayIcon | None = None  # set by the app when a tray icon exists
        self._open_model_manager = open_model_manager
        self._open_settings = open_settings
        self._views: dict[int, ChatView] = {}
        self.setWindowTitle("Ember")
        self.setWindowIcon(icon("ember"))
        self.resize(1100, 720)

        self.chat_list = ChatListPanel(chat_store, self)
        self.stack = QStackedWidget(self)
        self.empty = QLabel("Start a new chat with Ctrl+N", self, alignment=Qt.AlignCenter)
        self.stack.addWidget(self.empty)
        self.settings_panel = ChatSettingsPanel(self)
        splitter = QSplitter(self)
        splitter.addWidget(self.chat_list)
        splitter.addWidget(self.stack)
        splitter.addWidget(self.settings_panel)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([220, 620, 260])
        self.setCentralWidget(splitter)
        self.status = EngineStatusBar(engine, self)
        self.setStatusBar(self.status)
        self._build_menus()

        self.chat_list.chat_selected.connect(self.open_chat)
        self.chat_list.chat_deleted.connect(self._on_chat_deleted)
        self.settings_panel.settings_changed.connect(self._on_chat_settings_changed)
        self.settings_panel.model_changed.connect(self._on_chat_model_changed)
        engine.models_changed.connect(self.settings_panel.set_models)
        engine.message.connect(self._on_engine_message)
        self.settings_panel.set_models(list(engine.models))
        if self.chat_list.list.count():
            self.chat_list.list.setCurrentRow(0)

    # ---- chats ----
    def current_view(self) -> ChatView | None:
        w = self.stack.currentWidget()
        return w if isinstance(w, ChatView) else None

    def view(self, chat_id: int) -> ChatView | None:
        return self._views.get(chat_id)

    def new_chat(self) -> ChatView:
        chat_id = self.chat_list.new_chat()
        self.open_chat(chat_id)
        return self._views[chat_id]

    def open_chat(self, chat_id: int) -> ChatView:
        view = self._views.get(chat_id)
        if view is None:
            view = ChatView(self.chat_store, chat_id, self.engine, self)
            view.reply_stats.connect(self._on_reply_stats)
            view.title_changed.connect(self._on_title_changed)
            view.reply_started.connect(self._on_reply_started)
            view.reply_finished.connect(self._on_reply_finished)
            self._views[chat_id] = view
            self.stack.addWidget(view)
        self.stack.setCurrentWidget(view)
        chat = self.chat_store.get_chat(chat_id)
        self.settings_panel.load(chat.settings, chat.model)
        if self.chat_list.current_chat_id() != chat_id:
            self.chat_list.select(chat_id)
        view.input.setFocus()
        return view

    def export_chat(self, chat_id: int, path: Path, fmt: str) -> None:
        text = self.chat_store.export_markdown(chat_id) if fmt == "md" else self.chat_store.export_json(chat_id)
        Path(path).write_text(text, encoding="utf-8")

    # ---- slots ----
    def _on_chat_deleted(self, chat_id: int) -> None:
        view = self._views.pop(chat_id, None)
        if view is not None:
            view.stop()
            self.stack.removeWidget(view)
            view.deleteLater()
        if self.current_view() is None:
            self.stack.setCurrentWidget(self.empty)

    def _on_chat_settings_changed(self, values: dict) -> None:
        view = self.current_view()
        if view is not None:
            self.chat_store.update_chat_settings(view.chat_id, values)

    def _on_chat_model_changed(self, model: str) -> None:
        view = self.current_view()
        if view is not None:
            self.chat_store.set_chat_model(view.chat_id, model or None)

    def _on_reply_stats(self, stats: dict) -> None:
        view = self.current_view()
        if view is not None and view.chat_id == stats.get("chat_id"):
            self.status.on_reply_stats(stats)

    def _on_reply_started(self, chat_id: int) -> None:
        self.chat_list.set_streaming(chat_id, True)

    def _on_reply_finished(self, chat_id: int, _status: str) -> None:
        self.chat_list.set_streaming(chat_id, False)

    def _on_title_changed(self, _chat_id: int, _title: str) -> None:
        self.chat_list.refresh()

    def _on_engine_message(self, text: str) -> None:
        self.status.showMessage(text, 8000)

    def _on_export(self, fmt: str) -> None:
        view = self.current_view()
        if view is None:
            return
        title = self.chat_store.get_chat(view.chat_id).title or "chat"
        suffix, name = (".md", "Markdown (*.md)") if fmt == "md" else (".json", "JSON (*.json)")
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", title + suffix, name)
        if path:
            self.export_chat(view.chat_id, Path(path), fmt)

    def _on_about(self) -> None:
        QMessageBox.about(self, "About Ember", "Ember runs language models on this machine.\n"
                          "The engine is also an OpenAI-compatible server for other programs.")

    # ---- window ----
    def _build_menus(self) -> None:
        def action(menu, text, slot, shortcut=None) -> QAction:
            a = QAction(text, self)
            if shortcut:
                a.setShortcut(QKeySequence(shortcut))
            a.triggered.connect(slot)
            menu.addAction(a)
            return a

        file_menu = self.menuBar().addMenu("&File")
        self.new_chat_action = action(file_menu, "New chat", self.new_chat, QKeySequence.New)
        self.export_md_action = action(file_menu, "Export chat as Markdown…", lambda: self._on_export("md"))
        self.export_json_action = action(file_menu, "Export chat as JSON…", lambda: self._on_export("json"))
        file_menu.addSeparator()
        action(file_menu, "Close window", self.close, QKeySequence.Close)
        action(file_menu, "Quit", self.engine.request_quit, QKeySequence.Quit)
        server = self.menuBar().addMenu("&Engine")
        action(server, "Start server", self.engine.start_server)
        action(server, "Stop server", self.engine.stop_server)
        action(server, "Restart server", self.engine.restart_server)
        self.models_action = action(self.menuBar().addMenu("&Models"), "Model manager…",
                                    lambda: self._open_model_manager and self._open_model_manager(self))
        self.settings_action = action(self.menuBar().addMenu("&Settings"), "Preferences…",
                                      lambda: self._open_settings and self._open_settings(self),
                                      QKeySequence.Preferences)
        action(self.menuBar().addMenu("&Help"), "About Ember", self._on_about)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt name
        """With close_to_tray, closing hides the window and the engine keeps serving."""
        if self.settings.close_to_tray and self.tray is not None and self.tray.isVisible():
            event.ignore()
            self.hide()
            self.hidden_to_tray.emit()
            return
        event.accept()
        self.engine.request_quit()
