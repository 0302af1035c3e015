"""The question before a tool call runs: "Allow once / Always for this tool / Deny", with the server,
the tool, its description and the arguments the model wrote.

Everything shown is plain text (labels in PlainText format, the arguments in a QPlainTextEdit): the
model and the server wrote it, so nothing of it is ever rendered as HTML. Deny is the default button and
Escape denies: the dialog can come up while the user types in the message box, and an Enter meant for
the message must not run a tool. A denied call goes back to the model as a refusal, which costs little.
"""
from __future__ import annotations

import json

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from app.agent.mcp_connection import ToolInfo
from app.agent.steps import Approval, ToolStep


def pretty_arguments(step: ToolStep) -> str:
    """The arguments as indented JSON; the model's text as it is when it is not JSON."""
    value = step.arguments_object()
    return value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)


def _plain(text: str, parent: QWidget, **kwargs) -> QLabel:
    label = QLabel(text, parent, textFormat=Qt.PlainText, wordWrap=True, **kwargs)
    label.setTextInteractionFlags(Qt.TextSelectableByMouse)
    return label


class ToolApprovalDialog(QDialog):
    """`approval` after it closes: the button pressed; DENY for Deny, Escape or the window's close."""

    def __init__(self, step: ToolStep, tool: ToolInfo, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Allow a tool call?")
        self.setMinimumWidth(460)
        self.approval = Approval.DENY
        self.heading = _plain(f"The model wants to call {tool.name} on the MCP server {tool.server}.", self)
        font = self.heading.font()
        font.setBold(True)
        self.heading.setFont(font)
        self.description = _plain(tool.description.strip() or "(the server gives no description)", self)
        self.description.setStyleSheet("color: palette(placeholder-text)")
        self.arguments = QPlainTextEdit(pretty_arguments(step), self, readOnly=True)
        self.arguments.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
        lines = self.arguments.toPlainText().count("\n") + 1
        self.arguments.setFixedHeight(min(320, self.arguments.fontMetrics().lineSpacing() * (lines + 1) + 12))
        buttons = QDialogButtonBox(self)
        self.once = QPushButton("Allow once", self)
        self.always = QPushButton("Always for this tool", self)
        self.always.setToolTip(f"Run {tool.name} of {tool.server} from now on without asking "
                               "(kept in mcp.json's autoApprove)")
        self.deny = QPushButton("Deny", self)
        self.deny.setToolTip("The model is told the call was refused (Escape)")
        buttons.addButton(self.once, QDialogButtonBox.AcceptRole)
        buttons.addButton(self.always, QDialogButtonBox.AcceptRole)
        buttons.addButton(self.deny, QDialogButtonBox.RejectRole)
        self.once.clicked.connect(lambda: self._answer(Approval.ONCE))
        self.always.clicked.connect(lambda: self._answer(Approval.ALWAYS))
        self.deny.clicked.connect(self.reject)
        for button in (self.once, self.always):
            button.setAutoDefault(False)
        self.deny.setDefault(True)
        layout = QVBoxLayout(self)
        layout.addWidget(self.heading)
        layout.addWidget(self.description)
        layout.addWidget(QLabel("Arguments:", self))
        layout.addWidget(self.arguments)
        layout.addWidget(buttons)
        self.deny.setFocus()

    def _answer(self, approval: Approval) -> None:
        self.approval = approval
        self.accept()

    def reject(self) -> None:  # Deny, Escape, the window's close button
        self.approval = Approval.DENY
        super().reject()


def ask_approval(parent: QWidget | None, step: ToolStep, tool: ToolInfo) -> Approval:
    """Ask on the GUI thread (modal; blocks until answered)."""
    dialog = ToolApprovalDialog(step, tool, parent)
    try:
        dialog.exec()
        return dialog.approval
    finally:
        dialog.deleteLater()
