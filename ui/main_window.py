"""The main window: chat list | open chat | chat settings, with menus and the engine status bar.

Each opened chat keeps its ChatView (and its stream) alive while another chat is shown, so
several chats stream at once.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QByteArray, Qt, Signal
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (QFileDialog, QLabel, QMainWindow, QMessageBox, QSplitter,
                               QStackedWidget, QWidget)

from app.history import ChatStore
from app.reply_versions import ReplyVersions
from app.settings import Settings
from app.version import ember_version
from ui.chat_list import ChatListPanel
from ui.chat_settings_panel import ChatSettingsPanel
from ui.chat_view import ChatView
from ui.chat_warm import ChatWarmer
from ui.engine_controller import EngineController
from ui.engine_log_dialog import EngineLogDialog
from ui.resident_models import chatting_model, entry
from ui.resources import icon
from ui.status_bar import EngineStatusBar
from ui.tray import TrayIcon
from ui.window_actions import build_menus

log = logging.getLogger(__name__)
COMPLETION_NOTICE = ("{name} is a base model: its file has no chat template, so it continues text rather than "
                     "answering, and may repeat the question. A chat model (an instruct model) answers.")


class MainWindow(QMainWindow):
    """`hidden_to_tray` fires when closing only hid the window (the engine keeps serving)."""

    hidden_to_tray = Signal()

    def __init__(self, settings: Settings, chat_store: ChatStore, engine: EngineController,
                 open_model_manager: Callable[[QWidget], None] | None = None,
                 open_settings: Callable[[QWidget], None] | None = None,
                 model_defaults: Callable[[str | None], dict] | None = None,
                 local_models: Callable[[], list[tuple[str, str]]] | None = None,
                 reply_versions: ReplyVersions | None = None, tools: object = None,
                 parent: QWidget | None = None, open_documents: Callable[[QWidget], None] | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.chat_store = chat_store
        self.engine = engine
        self.tray: TrayIcon | None = None  # set by the app when a tray icon exists
        self._open_model_manager = open_model_manager
        self._open_settings = open_settings
        self._open_documents = open_documents
        self._model_defaults = model_defaults or (lambda _model: {})
        self._local_models = local_models or (lambda: [])
        self._reply_versions = reply_versions
        self.tools = tools  # the app's ChatTools (MCP servers), for every ChatView
        self._log_dialog: EngineLogDialog | None = None
        self._views: dict[int, ChatView] = {}
        self.setWindowTitle("Ember")
        self.setWindowIcon(icon("ember"))
        self._restore_geometry()

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
        splitter.setSizes([220, 600, 280])
        self.setCentralWidget(splitter)
        self.status = EngineStatusBar(engine, self, chats=lambda: [  # (title, model) of each open chat
            (c.title, c.model) for c in map(chat_store.get_chat, list(self._views))])
        self.setStatusBar(self.status)
        self.warmer = ChatWarmer(engine, self.stack, self)  # the chat shown: its prompt into the engine's cache
        self._build_menus()

        self.chat_list.chat_selected.connect(self.open_chat)
        self.chat_list.chat_deleted.connect(self._on_chat_deleted)
        self.settings_panel.settings_changed.connect(self._on_chat_settings_changed)
        self.settings_panel.model_changed.connect(self._on_chat_model_changed)
        engine.models_changed.connect(self.refresh_model_picker)
        engine.models_changed.connect(self._name_models)
        engine.message.connect(self._on_engine_message)
        engine.status_changed.connect(self._on_engine_status)
        self._shown_model: str | None = None
        self.refresh_model_picker()
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
            view = ChatView(self.chat_store, chat_id, self.engine, self._model_defaults, self._reply_versions, self,
                            tools=self.tools)
            view.title_changed.connect(self._on_title_changed)
            view.reply_started.connect(self._on_reply_started)
            view.reply_finished.connect(self._on_reply_finished)
            view.reply_usage.connect(self.status.show_cached)
            self._views[chat_id] = view
            self.stack.addWidget(view)
        self.stack.setCurrentWidget(view)
        self._show_chat_settings(view)
        if self.chat_list.current_chat_id() != chat_id:
            self.chat_list.select(chat_id)
        view.input.setFocus()
        return view

    def export_chat(self, chat_id: int, path: Path, fmt: str) -> None:
        store = self.chat_store  # a Markdown export copies the chat's images beside the file
        text = store.export_markdown(chat_id, Path(path)) if fmt == "md" else store.export_json(chat_id)
        try:
            Path(path).write_text(text, encoding="utf-8")
        except OSError as e:
            QMessageBox.warning(self, "Export chat", f"The chat was not exported: {e.strerror or e} ({path}).")
            return
        self.status.showMessage(f"Chat exported to {path}", 8000)

    def refresh_model_picker(self, *_: object) -> None:
        """The engine's models, and (for the local engine) the store's, which it lists on its next poll."""
        ids, names = list(self.engine.models), dict(self.engine.model_names)
        if not self.engine.is_remote:
            for model_id, name in self._local_models():  # the store's names say which are base models
                if model_id not in ids:
                    ids.append(model_id)
                names[model_id] = name
        ids.sort(key=lambda m: ((names.get(m) or m).casefold(), m))  # the same order however the engine lists them
        self.settings_panel.set_models(ids, names)

    def _show_chat_settings(self, view: ChatView) -> None:
        """The panel shows what this chat sends: its settings over the model's recommendation."""
        chat = self.chat_store.get_chat(view.chat_id)
        self.engine.chat_model = chat.model  # each chat has its own model: the status bar marks this one's
        self.status.show_models()
        self._shown_model = chat.model or self.engine.current_model
        self.settings_panel.load(chat.settings, chat.model, self._model_defaults(self._shown_model))

    # ---- slots ----
    def _on_engine_status(self, status: dict) -> None:
        if status.get("status") == "ready" or not status:  # the switches of the chat in view's own model
            own = entry(status, self.engine.current_model) or status
            self.settings_panel.set_speculation_available(bool(own.get("speculative")))
            self.settings_panel.set_thinking_switch(bool((own.get("thinking") or {}).get("switch")))
            self.settings_panel.set_effort_choice(bool((own.get("thinking") or {}).get("effort")))
        self._show_model_kind(status)
        view = self.current_view()  # the loaded model changed: its recommended settings may differ
        if view is not None and self.engine.current_model != self._shown_model \
                and not self.chat_store.get_chat(view.chat_id).model:
            self._show_chat_settings(view)

    def _name_models(self, *_: object) -> None:
        """The models under the replies by name, once /v1/models has said them (after a start)."""
        for view in self._views.values():
            view.transcript.model_names = self.engine.model_names
            view.transcript.schedule_render()

    def _show_model_kind(self, status: dict) -> None:
        """Chats on a loaded base model (no chat template) say so above their messages."""
        for view in self._views.values():
            model = self.chat_store.get_chat(view.chat_id).model or chatting_model(status)
            if (loaded := entry(status, model)) is not None:
                view.transcript.set_notice(COMPLETION_NOTICE.format(name=self.engine.model_names.get(model, model))
                                           if loaded.get("completion_only") else "")

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
            self._show_chat_settings(view)
            view.images.refresh()  # the attach button follows whether the new model can see

    def _on_reply_started(self, chat_id: int) -> None:
        self.chat_list.set_streaming(chat_id, True)
        self.engine.wake()  # the status bar follows the reply from its start

    def _on_reply_finished(self, chat_id: int, _status: str) -> None:
        self.chat_list.set_streaming(chat_id, False)

    def _on_title_changed(self, chat_id: int, _title: str) -> None:
        self.chat_list.update_title(chat_id)

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
        QMessageBox.about(self, "About Ember", f"Ember {ember_version()}\n\n"
                          "Ember runs language models on this machine. Its engine is also an "
                          f"OpenAI-compatible server for other programs ({self.engine.base_url or 'not running'}).")

    def _on_regenerate(self) -> None:
        view = self.current_view()
        if view is not None:
            view.regenerate()

    def _on_stop(self) -> None:
        view = self.current_view()
        if view is not None:
            view.stop()

    def _on_search(self) -> None:
        self.chat_list.search.setFocus()
        self.chat_list.search.selectAll()

    def show_engine_log(self) -> EngineLogDialog:
        if self._log_dialog is None:
            sup = self.engine.supervisor
            engine_log = sup.log_path if sup is not None else self.settings.logs_dir / "engine.log"
            self._log_dialog = EngineLogDialog(engine_log, self.settings.logs_dir / "ember.log", self)
        self._log_dialog.refresh()
        self._log_dialog.show()
        self._log_dialog.raise_()
        return self._log_dialog

    # ---- window ----
    def _build_menus(self) -> None:
        self.actions = build_menus(
            self, new_chat=self.new_chat, export=self._on_export, regenerate=self._on_regenerate,
            stop=self._on_stop, search=self._on_search, engine=self.engine,
            models=lambda: self._open_model_manager and self._open_model_manager(self),
            settings=lambda: self._open_settings and self._open_settings(self),
            engine_log=self.show_engine_log, about=self._on_about,
            documents=lambda: self._open_documents and self._open_documents(self))
        self.new_chat_action, self.models_action = self.actions.new_chat, self.actions.models
        self.settings_action = self.actions.settings

    def _restore_geometry(self) -> None:
        saved = self.settings.window_geometry
        if not (saved and self.restoreGeometry(QByteArray.fromBase64(saved.encode("ascii")))):
            self.resize(1100, 720)

    def save_geometry(self) -> None:
        """Remember the window's size and place (in settings.json) for the next start."""
        self.settings.window_geometry = bytes(self.saveGeometry().toBase64()).decode("ascii")
        try:
            self.settings.save()
        except OSError as e:
            log.warning("could not save the window size: %s", e)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt name
        """With close_to_tray, closing hides the window and the engine keeps serving; where there is no
        tray to come back from, the window is minimized instead, and says so (Quit is in the File menu)."""
        self.save_geometry()
        if self.settings.close_to_tray and not self.engine.quitting:  # Qt's quit closes the windows too
            event.ignore()
            if self.tray is not None and self.tray.isVisible():
                self.hide()
                self.hidden_to_tray.emit()
            else:
                self.showMinimized()
                self.status.showMessage("No system tray: Ember keeps serving, minimized. File → Quit Ember quits.",
                                        20000)
            return
        event.accept()
        self.engine.request_quit()
