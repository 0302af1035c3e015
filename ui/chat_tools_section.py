"""The chat panel's Tools: which MCP servers this chat uses, and which of their tools are off.

Each configured server is a checkbox (the chat's `mcp_servers`); under a ready server, its tools are
checkboxes too (unticked ones are the chat's `mcp_tools_off`, "server/tool"). A server ticked here
starts at once on a worker, so its tools can be listed and chosen before the chat sends.
"""
from __future__ import annotations

import logging
import threading

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor, QPalette
from PySide6.QtWidgets import QGroupBox, QLabel, QPushButton, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget

from app.agent.chat_tools import SERVERS_KEY, TOOLS_OFF_KEY, ChatTools
from app.agent.prompt_commands import usage
from app.agent.mcp_connection import ServerState, ServerStatus
from ui.mcp_states import ServerStates

log = logging.getLogger(__name__)
RED, GREY = "#c92a2a", "#868e96"
NAME_ROLE = Qt.UserRole  # the server name, or "server/tool"


class ChatToolsSection(QGroupBox):
    """`changed(dict)`: the chat settings to merge (a key None when the chat has nothing there);
    `configure_requested`: the user asked for Settings -> Tools."""

    changed = Signal(dict)
    configure_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Tools", parent)
        self.tools: ChatTools | None = None
        self._on: list[str] = []
        self._off: set[str] = set()
        self._loading = False
        self.tree = QTreeWidget(self, headerHidden=True, columnCount=1)
        self.tree.setMinimumHeight(110)
        # Fusion outlines an item's checkbox in the Window colour darkened, which vanishes on the dark
        # theme's Base: outline them in the muted text colour instead (both themes)
        palette = self.tree.palette()
        palette.setColor(QPalette.Window, QColor(GREY))
        self.tree.setPalette(palette)
        self.tree.setToolTip("Tick the MCP servers this chat may use; under a running server, untick the "
                             "tools the model should not see")
        self.note = QLabel(self, wordWrap=True, textFormat=Qt.PlainText)
        self.problems = QLabel(self, wordWrap=True, textFormat=Qt.PlainText)
        self.problems.setStyleSheet(f"color: {RED}")
        self.configure = QPushButton("Servers…", self)
        self.configure.setToolTip("Settings → Tools: add, edit and test MCP servers")
        self.configure.clicked.connect(self.configure_requested)
        layout = QVBoxLayout(self)
        layout.addWidget(self.note)
        layout.addWidget(self.tree)
        layout.addWidget(self.problems)
        layout.addWidget(self.configure, 0, Qt.AlignLeft)
        self.tree.itemChanged.connect(self._on_item_changed)
        self.setVisible(False)  # until the app hands it its servers

    def set_tools(self, tools: ChatTools, states: ServerStates | None = None) -> None:
        self.tools = tools
        if states is not None:
            states.changed.connect(self._on_state)
        self.setVisible(True)
        self.refresh()

    def load(self, chat_settings: dict) -> None:
        """Show a chat's choice (without emitting `changed`)."""
        self._on = ChatTools.chat_servers(chat_settings or {})
        self._off = set((chat_settings or {}).get(TOOLS_OFF_KEY) or [])
        self.refresh()

    def values(self) -> dict:
        return {SERVERS_KEY: list(self._on) or None, TOOLS_OFF_KEY: sorted(self._off) or None}

    def _on_state(self, _state: ServerState) -> None:
        self.refresh()

    def refresh(self) -> None:
        if self.tools is None:
            return
        self._loading = True
        self.tree.clear()
        states, problems = self.tools.states(), []
        for name, cfg in self.tools.servers.items():
            state = states.get(name)
            status = ServerStatus.DISABLED if cfg.disabled else state.status if state else ServerStatus.STOPPED
            item = QTreeWidgetItem(self.tree, [name + {ServerStatus.STARTING: " · starting…",
                                                       ServerStatus.FAILED: " · failed",
                                                       ServerStatus.DISABLED: " · disabled"}.get(status, "")])
            item.setData(0, NAME_ROLE, name)
            item.setToolTip(0, cfg.describe() + (f"\n{state.describe()}" if state and not cfg.disabled else ""))
            if status is ServerStatus.DISABLED:
                item.setFlags(Qt.ItemIsSelectable)  # not enabled: Settings -> Tools turns it back on
                item.setForeground(0, QBrush(QColor(GREY)))
                continue
            item.setFlags(Qt.ItemIsEnabled | Qt.ItemIsUserCheckable)
            item.setCheckState(0, Qt.Checked if name in self._on else Qt.Unchecked)
            if status is ServerStatus.FAILED:
                item.setForeground(0, QBrush(QColor(RED)))
                problems.append(f"{name}: {state.error}")  # its item already says "failed"
            self._add_tools(item, name, status, state)
        self.tree.expandAll()
        self._loading = False
        self.note.setText("" if self.tools.servers else "No MCP servers yet. Add them in Settings → Tools.")
        self.note.setVisible(not self.tools.servers)
        self.tree.setVisible(bool(self.tools.servers))
        self.problems.setText("\n".join(problems))
        self.problems.setVisible(bool(problems))

    def _add_tools(self, item: QTreeWidgetItem, name: str, status: ServerStatus, state: ServerState | None) -> None:
        on = name in self._on
        if status is not ServerStatus.READY or state is None:
            if on and status in (ServerStatus.STOPPED, ServerStatus.STARTING):
                hint = QTreeWidgetItem(item, ["its tools show once it runs"])
                hint.setFlags(Qt.NoItemFlags)
            return
        for tool in state.tools:
            key = f"{name}/{tool.name}"
            child = QTreeWidgetItem(item, [tool.name])
            child.setData(0, NAME_ROLE, key)
            child.setToolTip(0, tool.description or tool.name)
            child.setFlags(Qt.ItemIsUserCheckable | (Qt.ItemIsEnabled if on else Qt.NoItemFlags))
            child.setCheckState(0, Qt.Unchecked if key in self._off else Qt.Checked)
        for prompt in state.prompts:  # typed as `/name …` in the message box (app/agent/prompt_commands.py)
            line = QTreeWidgetItem(item, [usage(prompt)])
            line.setToolTip(0, (prompt.description or prompt.name) + "\nType it in the message box.")
            line.setFlags(Qt.ItemIsEnabled if on else Qt.NoItemFlags)

    def _on_item_changed(self, item: QTreeWidgetItem, _column: int) -> None:
        if self._loading:
            return
        key, checked = item.data(0, NAME_ROLE), item.checkState(0) == Qt.Checked
        if item.parent() is not None:  # a tool
            self._off.discard(key) if checked else self._off.add(key)
        else:  # a server: its tools can be chosen while it is on
            if checked and key not in self._on:
                self._on.append(key)
                self._start(key)
            elif not checked and key in self._on:
                self._on.remove(key)
            self._loading = True
            for i in range(item.childCount()):
                child = item.child(i)
                if child.data(0, NAME_ROLE):
                    child.setFlags(Qt.ItemIsUserCheckable | (Qt.ItemIsEnabled if checked else Qt.NoItemFlags))
            self._loading = False
        self.changed.emit(self.values())

    def _start(self, name: str) -> None:
        """A server just ticked starts now (on a worker), so its tools show here before the chat sends."""
        state = self.tools.states().get(name)
        if state is not None and state.status in (ServerStatus.STOPPED, ServerStatus.FAILED):
            threading.Thread(target=self._start_worker, args=(name,), name=f"mcp-start-{name}", daemon=True).start()

    def _start_worker(self, name: str) -> None:
        try:
            self.tools.host.start([name], retry=True)  # the user asked: a failed server tries again
        except Exception:  # noqa: BLE001 - the host closed meanwhile (the app quitting)
            log.exception("starting the MCP server %s failed", name)
