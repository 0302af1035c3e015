"""Settings -> Tools -> Add / Edit: one MCP server, a command to run (stdio) or a URL (Streamable HTTP).

The form builds the same `mcpServers` entry a user would write in mcp.json and checks it with
mcp_config.parse_server, so the form and the file refuse the same things, in the same words.
"""
from __future__ import annotations

import shlex
from dataclasses import replace

from PySide6.QtWidgets import (QButtonGroup, QDialog, QDialogButtonBox, QFormLayout, QHBoxLayout, QLabel,
                               QLineEdit, QPlainTextEdit, QRadioButton, QVBoxLayout, QWidget)

from app.agent.mcp_config import McpConfigError, ServerConfig, parse_server


def _pairs_text(pairs: dict[str, str], sep: str) -> str:
    return "\n".join(f"{k}{sep}{v}" for k, v in pairs.items())


def _pairs(text: str, sep: str, what: str) -> dict[str, str]:
    """`KEY=value` (or `Name: value`) lines -> a dict; blank lines are skipped."""
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, found, value = line.partition(sep)
        if not found or not key.strip():
            raise McpConfigError(f"{what}, line {n}: write it as NAME{sep}{'' if sep == '=' else ' '}value")
        out[key.strip()] = value.strip() if sep != "=" else value
    return out


class ServerForm(QDialog):
    """`server()` after accept: the ServerConfig the user wrote (its `disabled`, `autoApprove` and
    other apps' keys kept from the server being edited)."""

    def __init__(self, taken: set[str], server: ServerConfig | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Edit MCP server" if server else "Add MCP server")
        self.setMinimumWidth(480)
        self._taken, self._old, self._result = set(taken), server, None
        self.name = QLineEdit(server.name if server else "", self, placeholderText="e.g. files")
        self.stdio = QRadioButton("Run a command (stdio)", self, checked=not (server and server.url))
        self.http = QRadioButton("Connect to a URL (Streamable HTTP)", self, checked=bool(server and server.url))
        kinds = QButtonGroup(self)
        kinds.addButton(self.stdio)
        kinds.addButton(self.http)
        self.command = QLineEdit(server.command or "" if server else "", self, placeholderText="e.g. npx")
        self.args = QLineEdit(shlex.join(server.args) if server else "", self,
                              placeholderText="e.g. -y @modelcontextprotocol/server-filesystem ~/Documents")
        self.args.setToolTip("As in a terminal: separated by spaces; quote an argument that holds one")
        self.env = self._lines(_pairs_text(server.env, "=") if server else "", "KEY=value, one a line")
        self.url = QLineEdit(server.url or "" if server else "", self, placeholderText="https://example.com/mcp")
        self.headers = self._lines(_pairs_text(server.headers, ": ") if server else "",
                                   "Authorization: Bearer …, one a line")
        self.error = QLabel(self, wordWrap=True)
        self.error.setStyleSheet("color: #c92a2a")
        self._lay_out()
        self.stdio.toggled.connect(self._show_kind)
        self._show_kind()

    def _lines(self, text: str, placeholder: str) -> QPlainTextEdit:
        edit = QPlainTextEdit(text, self, placeholderText=placeholder)
        edit.setTabChangesFocus(True)
        edit.setMaximumHeight(70)
        return edit

    def _lay_out(self) -> None:
        form = QFormLayout()
        form.addRow("Name", self.name)
        kind = QHBoxLayout()
        kind.addWidget(self.stdio)
        kind.addWidget(self.http)
        kind.addStretch(1)
        form.addRow("Kind", kind)
        self.rows = {"stdio": [("Command", self.command), ("Arguments", self.args), ("Environment", self.env)],
                     "http": [("URL", self.url), ("Headers", self.headers)]}
        for row in (*self.rows["stdio"], *self.rows["http"]):
            form.addRow(*row)
        self.form = form
        buttons = QDialogButtonBox(QDialogButtonBox.Save | QDialogButtonBox.Cancel, self)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addWidget(buttons)

    def _show_kind(self, *_: object) -> None:
        for kind, rows in self.rows.items():
            for _label, widget in rows:
                self.form.setRowVisible(widget, (kind == "stdio") == self.stdio.isChecked())

    def entry(self) -> dict:
        """The `mcpServers` entry as mcp.json would hold it; McpConfigError for a line it cannot read."""
        if self.stdio.isChecked():
            try:
                args = shlex.split(self.args.text())
            except ValueError as exc:
                raise McpConfigError(f"the arguments cannot be read ({exc})") from None
            return {"command": self.command.text().strip(), "args": args,
                    "env": _pairs(self.env.toPlainText(), "=", "Environment")}
        return {"url": self.url.text().strip(), "headers": _pairs(self.headers.toPlainText(), ":", "Headers")}

    def accept(self) -> None:
        name = self.name.text().strip()
        try:
            if not name:
                raise McpConfigError("give the server a name")
            if name in self._taken and not (self._old and name == self._old.name):
                raise McpConfigError(f"there is already a server named {name!r}")
            server = parse_server(name, self.entry())
        except McpConfigError as exc:
            self.error.setText(str(exc))
            return
        if self._old is not None:
            server = replace(server, disabled=self._old.disabled, auto_approve=self._old.auto_approve,
                             extra=self._old.extra)
        self._result = server
        super().accept()

    def server(self) -> ServerConfig | None:
        return self._result
