"""Settings -> Tools: the MCP servers of mcp.json with their state, added, edited, switched off, removed,
imported from Claude Desktop and started to test; and the limits of a chat's tool calls.

Server edits are written to mcp.json at once (ChatTools.save applies them: a changed server restarts when
next needed), as Claude Desktop and LM Studio do; the two limits are Settings fields, saved with the dialog.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QBrush, QColor, QDesktopServices
from PySide6.QtWidgets import (QDoubleSpinBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QMessageBox,
                               QPushButton, QSpinBox, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget)

from app.agent.chat_tools import ChatTools
from app.agent.mcp_config import (McpConfigError, ServerConfig, claude_desktop_config_path, load_config,
                                  merge_imported)
from app.agent.mcp_connection import ServerState, ServerStatus
from app.settings import Settings
from ui.mcp_server_form import ServerForm
from ui.mcp_states import ServerStates

log = logging.getLogger(__name__)
RED, GREEN = "#c92a2a", "#2b8a3e"


def state_words(cfg: ServerConfig, state: ServerState | None) -> str:
    """A server's state as the list says it; a configured server that has not run is "not started"."""
    if cfg.disabled:
        return "disabled"
    if state is None or state.status is ServerStatus.STOPPED:
        return "not started"
    return state.describe()


class ToolsPage(QWidget):
    """The Tools tab of SettingsDialog. Without a ChatTools (none was built) only the limits show."""

    def __init__(self, settings: Settings, tools: ChatTools | None = None, states: ServerStates | None = None,
                 show_log: Callable[[], object] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tools, self._show_log = tools, show_log
        self.form: ServerForm | None = None      # the open Add/Edit form
        self.confirm: QMessageBox | None = None  # the open "Remove?" question
        self._starting: str | None = None  # the server Start / Test waits for
        self.step_limit = QSpinBox(self, minimum=1, maximum=100, value=settings.tool_step_limit)
        self.step_limit.setToolTip("Replies in one turn that may call tools; then the model must answer")
        self.timeout = QDoubleSpinBox(self, minimum=1.0, maximum=3600.0, decimals=0, suffix=" s",
                                      value=settings.tool_timeout_s)
        self.timeout.setToolTip("A call that runs longer is cancelled, and the model is told so")
        layout = QVBoxLayout(self)
        if tools is not None:
            layout.addWidget(self._servers_box(), 1)
        limits = QGroupBox("Tool calls", self)
        form = QFormLayout(limits)
        form.addRow("Steps in one turn", self.step_limit)
        form.addRow("Time for one call", self.timeout)
        layout.addWidget(limits)
        if tools is not None:
            if states is not None:
                states.changed.connect(self._on_state)
            self.refresh()

    def _button(self, text: str, slot: Callable[[], None], tip: str = "") -> QPushButton:
        button = QPushButton(text, self)
        button.clicked.connect(lambda: slot())
        button.setToolTip(tip)
        return button

    def _servers_box(self) -> QGroupBox:
        box = QGroupBox("MCP servers", self)
        self.error = QLabel(self, wordWrap=True, textFormat=Qt.PlainText)
        self.error.setStyleSheet(f"color: {RED}")
        self.tree = QTreeWidget(self, columnCount=3)
        self.tree.setHeaderLabels(["Server", "State", "Details"])
        self.tree.setColumnWidth(0, 140)
        self.tree.setColumnWidth(1, 170)
        self.tree.itemSelectionChanged.connect(self._show_selected)
        self.tree.itemDoubleClicked.connect(lambda item, _col: item.parent() is None and self._on_edit())
        self.details = QLabel(self, wordWrap=True, textFormat=Qt.PlainText,
                              textInteractionFlags=Qt.TextSelectableByMouse)
        self.message = QLabel(self, wordWrap=True, textFormat=Qt.PlainText)
        self.add_button = self._button("Add…", self._on_add)
        self.edit_button = self._button("Edit…", self._on_edit)
        self.toggle_button = self._button("Disable", self._on_toggle, "A disabled server stays in mcp.json "
                                          "but no chat starts it")
        self.remove_button = self._button("Remove", self._on_remove)
        self.start_button = self._button("Start / Test", self._on_start, "Start the server now and list its tools")
        self.import_button = self._button("Import from Claude Desktop", self._on_import,
                                          f"Adds the servers of {claude_desktop_config_path()} not here yet")
        self.open_button = self._button("Open mcp.json", self._on_open_file, str(self.tools.path))
        self.reload_button = self._button("Reload", self._on_reload, "Read mcp.json again after editing it")
        self.log_button = self._button("Show log", self._on_log, "The servers' own messages (stderr) are in "
                                       "the app's log")
        side = QVBoxLayout()
        for b in (self.add_button, self.edit_button, self.toggle_button, self.remove_button, self.start_button):
            side.addWidget(b)
        side.addStretch(1)
        top = QHBoxLayout()
        top.addWidget(self.tree, 1)
        top.addLayout(side)
        bottom = QHBoxLayout()
        for b in (self.import_button, self.open_button, self.reload_button, self.log_button):
            bottom.addWidget(b)
        bottom.addStretch(1)
        layout = QVBoxLayout(box)
        layout.addWidget(self.error)
        layout.addLayout(top, 1)
        layout.addWidget(self.details)
        layout.addLayout(bottom)
        layout.addWidget(self.message)
        return box

    # ---- the list ----
    def refresh(self) -> None:
        """Redraw the servers from ChatTools (kept: the selection, and which servers are collapsed)."""
        chosen, collapsed = self.selected_name(), {self.tree.topLevelItem(i).text(0) for i in
                                                   range(self.tree.topLevelItemCount())
                                                   if not self.tree.topLevelItem(i).isExpanded()}
        states = self.tools.states()
        self.tree.clear()
        for name, cfg in self.tools.servers.items():
            item = QTreeWidgetItem(self.tree, [name, state_words(cfg, states.get(name)), cfg.describe()])
            item.setToolTip(1, item.text(1))
            item.setToolTip(2, cfg.describe())
            self._colour(item, cfg, states.get(name))
            for tool in (states[name].tools if name in states and not cfg.disabled else ()):
                first_line = (tool.description.strip().splitlines() or [""])[0]
                child = QTreeWidgetItem(item, [tool.name, "always allowed" if tool.name in cfg.auto_approve else "",
                                               first_line])
                child.setToolTip(2, tool.description)
            item.setExpanded(name not in collapsed)
            if name == chosen:
                item.setSelected(True)
                self.tree.setCurrentItem(item)
        broken = bool(self.tools.error)
        self.error.setText(f"mcp.json cannot be read: {self.tools.error}\nFix it (Open mcp.json), then Reload; "
                           "until then no server runs." if broken else "")
        self.error.setVisible(broken)
        self.add_button.setEnabled(not broken)  # saving now would overwrite the user's file
        self.import_button.setEnabled(not broken)
        self._show_selected()

    def _colour(self, item: QTreeWidgetItem, cfg: ServerConfig, state: ServerState | None) -> None:
        status = state.status if state is not None and not cfg.disabled else None
        colour = {ServerStatus.READY: GREEN, ServerStatus.FAILED: RED}.get(status)
        if colour:
            item.setForeground(1, QBrush(QColor(colour)))
        if cfg.disabled:
            for col in range(3):
                item.setForeground(col, QBrush(QColor("#868e96")))

    def selected_name(self) -> str | None:
        item = self.tree.currentItem() if self.tree.selectedItems() else None
        while item is not None and item.parent() is not None:
            item = item.parent()
        return item.text(0) if item is not None else None

    def _show_selected(self) -> None:
        name = self.selected_name()
        cfg = self.tools.servers.get(name) if name else None
        for button in (self.edit_button, self.toggle_button, self.remove_button, self.start_button):
            button.setEnabled(cfg is not None and not self.tools.error)
        self.start_button.setEnabled(cfg is not None and not cfg.disabled and not self.tools.error)
        self.toggle_button.setText("Enable" if cfg is not None and cfg.disabled else "Disable")
        state = self.tools.states().get(name) if name else None
        self.details.setText(f"{name}: {cfg.describe()}\n{state_words(cfg, state)}" if cfg else
                             "No MCP servers yet: Add one, or import Claude Desktop's." if not self.tools.servers
                             else "")

    def _on_state(self, state: ServerState) -> None:
        if state.name == self._starting and state.status in (ServerStatus.READY, ServerStatus.FAILED):
            self._starting = None
            self.message.setText(f"{state.name}: {state.describe()}")
        self.refresh()

    # ---- edits ----
    def _save(self, servers: dict[str, ServerConfig], done: str = "") -> bool:
        try:
            self.tools.save(servers)
        except OSError as exc:
            self.message.setText(f"mcp.json was not written: {exc.strerror or exc} ({self.tools.path})")
            return False
        self.message.setText(done)
        self.refresh()
        return True

    def _on_add(self) -> None:
        self._open_form(None)

    def _on_edit(self) -> None:
        name = self.selected_name()
        if name in self.tools.servers:
            self._open_form(self.tools.servers[name])

    def _open_form(self, old: ServerConfig | None) -> None:
        self.form = ServerForm(set(self.tools.servers), old, self)
        self.form.accepted.connect(lambda: self._on_form_saved(old, self.form.server()))
        self.form.open()

    def _on_form_saved(self, old: ServerConfig | None, new: ServerConfig | None) -> None:
        if new is None:
            return
        servers = {}  # a renamed server keeps its place in the list
        for name, cfg in self.tools.servers.items():
            servers[new.name if old is not None and name == old.name else name] = \
                new if old is not None and name == old.name else cfg
        servers.setdefault(new.name, new)
        if self._save(servers, f"Saved {new.name}." + (" Start / Test tries it now." if old is None else "")):
            self._select(new.name)

    def _select(self, name: str) -> None:
        for i in range(self.tree.topLevelItemCount()):
            if self.tree.topLevelItem(i).text(0) == name:
                self.tree.setCurrentItem(self.tree.topLevelItem(i))

    def _on_toggle(self) -> None:
        name = self.selected_name()
        if name in self.tools.servers:
            cfg = self.tools.servers[name]
            self._save({**self.tools.servers, name: replace(cfg, disabled=not cfg.disabled)},
                       f"{name} is {'enabled' if cfg.disabled else 'disabled'}.")

    def _on_remove(self) -> None:
        name = self.selected_name()
        if name not in self.tools.servers:
            return
        self.confirm = QMessageBox(QMessageBox.Question, "Remove server",
                                   f"Remove {name} from mcp.json? Its entry (and any key in it) is deleted.",
                                   QMessageBox.Yes | QMessageBox.No, self)
        self.confirm.setDefaultButton(QMessageBox.No)
        self.confirm.accepted.connect(lambda: self._save({n: c for n, c in self.tools.servers.items() if n != name},
                                                         f"Removed {name}."))
        self.confirm.open()

    def _on_start(self) -> None:
        name = self.selected_name()
        if name not in self.tools.servers or self.tools.servers[name].disabled:
            return
        state = self.tools.states().get(name)
        if state is not None and state.status is ServerStatus.READY:
            self.message.setText(f"{name} is running: {state.describe()}")
            return
        self._starting = name
        self.message.setText(f"Starting {name}…")
        threading.Thread(target=self._start, args=(name,), name=f"mcp-test-{name}", daemon=True).start()

    def _start(self, name: str) -> None:
        """On a worker: blocks until the server is ready or failed (the state signal redraws the list)."""
        try:
            self.tools.host.start([name], retry=True)  # the user asked: a failed server tries again
        except Exception:  # noqa: BLE001 - a host that was closed meanwhile (the app quitting)
            log.exception("starting the MCP server %s failed", name)

    def _on_import(self) -> None:
        path = claude_desktop_config_path()
        if not path.is_file():
            self.message.setText(f"No Claude Desktop configuration was found (looked for {path}).")
            return
        try:
            imported = load_config(path)
        except McpConfigError as exc:
            self.message.setText(f"Claude Desktop's configuration cannot be read: {exc}")
            return
        merged, added = merge_imported(self.tools.servers, imported)
        kept = [n for n in imported if n not in added]
        note = f" Already here: {', '.join(kept)}." if kept else ""
        if not added:
            self.message.setText(f"Nothing new in {path}." + note if imported else f"{path} lists no servers.")
            return
        self._save(merged, f"Imported {', '.join(added)} from Claude Desktop.{note}")

    def _on_open_file(self) -> None:
        path = self.tools.path
        if not path.exists() and not self.tools.error:
            self._save(dict(self.tools.servers))  # an editor opens an (empty) file rather than nothing
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(path))):
            self.message.setText(f"No editor opened it: the file is {path}")

    def _on_reload(self) -> None:
        """Read mcp.json again (after the user edited it by hand) and apply it."""
        if self.tools.reload():
            self.message.setText(f"Read {self.tools.path}.")
        self.refresh()

    def _on_log(self) -> None:
        if self._show_log is not None:
            self._show_log()
