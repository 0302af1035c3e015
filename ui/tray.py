"""The tray icon: shows the engine's state; its menu is rebuilt from current state each time it opens."""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from app.supervisor import SupervisorState
from ui.engine_controller import REMOTE, EngineController
from ui.resident_models import models_line, resident
from ui.resources import engine_state_icon

TOOLTIPS = {SupervisorState.READY: "serving", SupervisorState.STARTING: "loading a model",
            SupervisorState.STOPPED: "stopped", SupervisorState.CRASHED: "restarting the engine",
            SupervisorState.ERROR: "engine error", REMOTE: "remote server"}


class TrayIcon(QSystemTrayIcon):
    """Reads only the controller (no storage, no widgets of its own beyond the menu).

    `save_settings` persists that the close-to-tray notice was shown.
    """

    def __init__(self, controller: EngineController, save_settings: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.controller = controller
        self._save_settings = save_settings
        self.menu = QMenu()
        self.menu.aboutToShow.connect(self.rebuild_menu)
        self.setContextMenu(self.menu)
        self.activated.connect(self._on_activated)
        controller.state_changed.connect(self._on_state_changed)
        self._on_state_changed(controller.state)
        self.rebuild_menu()

    def rebuild_menu(self) -> None:
        """The whole menu from the controller's state (Vorta's pattern: no sync code)."""
        c, m = self.controller, self.menu
        m.clear()
        self.open_action = self._add("Open Ember", c.request_show_window)
        m.addSeparator()
        url = c.base_url
        address = self._add(f"Server: {url}" if url else "Server: not running", None)
        address.setEnabled(False)
        self.copy_address_action = self._add("Copy server address", self.copy_address)
        self.copy_address_action.setEnabled(bool(url))
        self.copy_key_action = self._add("Copy API key", self.copy_api_key)
        self.copy_key_action.setEnabled(bool(c.api_key))
        if not c.is_remote:
            if c.state in (SupervisorState.STOPPED, SupervisorState.ERROR):
                self.server_action = self._add("Start engine", c.start_server)
            else:
                self.server_action = self._add("Stop engine", c.stop_server)
        m.addSeparator()
        loaded = models_line(c.last_status, c.model_names, None)  # every model the engine holds
        several = len(resident(c.last_status)) > 1
        current = self._add(f"Models: {loaded}" if several else loaded or "Model: none loaded", None)
        current.setEnabled(False)
        m.addSeparator()
        self.quit_action = self._add("Quit Ember", c.request_quit)

    def copy_api_key(self) -> None:
        QGuiApplication.clipboard().setText(self.controller.api_key or "")

    def copy_address(self) -> None:
        QGuiApplication.clipboard().setText(self.controller.base_url or "")

    def action_texts(self) -> list[str]:
        return [a.text() for a in self.menu.actions() if not a.isSeparator()]

    def on_window_hidden(self) -> None:
        """The first time the window closes to the tray, say that the engine keeps serving."""
        settings = self.controller.settings
        if settings.tray_notice_shown:
            return
        self.showMessage("Ember is still running",
                         "The engine keeps serving other programs from the tray. Choose Quit Ember in this menu to stop it.",
                         QSystemTrayIcon.Information, 8000)
        settings.tray_notice_shown = True
        if self._save_settings is not None:
            self._save_settings()

    def _add(self, text: str, slot) -> QAction:
        action = self.menu.addAction(text)
        if slot is not None:
            action.triggered.connect(slot)
        return action

    def _on_state_changed(self, state: str) -> None:
        self.setIcon(engine_state_icon(state))
        self.setToolTip(f"Ember — {TOOLTIPS.get(state, state)}")

    def _on_activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason in (QSystemTrayIcon.Trigger, QSystemTrayIcon.DoubleClick):
            self.controller.request_show_window()
