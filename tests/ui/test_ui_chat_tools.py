"""The chat panel's Tools section in the real app (build_app, no engine), over a real stdio MCP server:
its checkboxes write the chat's settings, a failed server says why, and the app's shutdown ends the
servers' processes. And the approval dialog: each button's answer, Escape and Enter deny, nothing
the model or server wrote is read as HTML. Offscreen."""
from __future__ import annotations

import json

import psutil
import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication

from app.agent.chat_tools import config_path
from app.agent.mcp_connection import ToolInfo
from app.agent.steps import Approval, ToolStep
from app.gui_main import build_app
from mcp_util import SERVER_SCRIPT, stdio_server_entry
from ui.tool_approval import ToolApprovalDialog, ask_approval
from ui_support import make_settings

pytestmark = pytest.mark.timeout(180)
START_MS = 60_000


def server_processes() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True)
            if str(SERVER_SCRIPT) in " ".join(p.cmdline())]


def items(tree, parent=None) -> dict:
    """A server's items by name, or a server item's tools by name."""
    count = parent.childCount() if parent else tree.topLevelItemCount()
    found = [parent.child(i) if parent else tree.topLevelItem(i) for i in range(count)]
    return {it.text(0) if parent else it.data(0, Qt.UserRole): it for it in found}


def test_the_panels_checkboxes_write_the_chat_settings_and_quit_ends_the_servers(qtbot, tmp_path):
    settings = make_settings(tmp_path / "app")
    config_path(settings).parent.mkdir(parents=True, exist_ok=True)
    config_path(settings).write_text(json.dumps({"mcpServers": {
        "demo": stdio_server_entry(), "ghost": {"command": "/nonexistent/ember-mcp-ghost"},
        "off": {**stdio_server_entry(), "disabled": True}}}))
    ember = build_app(settings)
    qtbot.addWidget(ember.window)
    try:
        view = ember.window.new_chat()
        section = ember.window.settings_panel.tools
        assert not section.isHidden() and list(items(section.tree)) == ["demo", "ghost", "off"]
        assert [it.text(0) for it in items(section.tree).values()] == ["demo", "ghost", "off · disabled"]
        assert all(it.checkState(0) == Qt.Unchecked for it in list(items(section.tree).values())[:2])
        assert not server_processes()  # nothing starts until a chat asks for it
        items(section.tree)["demo"].setCheckState(0, Qt.Checked)  # ticked: on for this chat, and started
        assert ember.chat_store.get_chat(view.chat_id).settings["mcp_servers"] == ["demo"]
        qtbot.waitUntil(lambda: "lookup" in items(section.tree, items(section.tree)["demo"]), timeout=START_MS)
        tools = items(section.tree, items(section.tree)["demo"])
        assert list(tools) == ["lookup", "add", "sleep", "crash", "big", "fail", "/review topic=…"]
        prompt = tools.pop("/review topic=…")  # a prompt: typed as a /command, not ticked
        assert not prompt.flags() & Qt.ItemIsUserCheckable and "message box" in prompt.toolTip(0)
        assert all(t.checkState(0) == Qt.Checked and t.flags() & Qt.ItemIsEnabled for t in tools.values())
        tools["add"].setCheckState(0, Qt.Unchecked)
        assert ember.chat_store.get_chat(view.chat_id).settings["mcp_tools_off"] == ["demo/add"]
        items(section.tree)["ghost"].setCheckState(0, Qt.Checked)
        qtbot.waitUntil(lambda: items(section.tree)["ghost"].text(0) == "ghost · failed", timeout=START_MS)
        assert section.problems.text() == "ghost: command not found: /nonexistent/ember-mcp-ghost"
        chat = ember.chat_store.get_chat(view.chat_id).settings
        assert (chat["mcp_servers"], chat["mcp_tools_off"]) == (["demo", "ghost"], ["demo/add"])
        other = ember.window.new_chat()  # another chat: its own choice (none)
        assert all(it.checkState(0) == Qt.Unchecked for it in list(items(section.tree).values())[:2])
        ember.window.open_chat(view.chat_id)  # back: as it was saved
        demo = items(section.tree)["demo"]
        assert demo.checkState(0) == Qt.Checked and items(section.tree, demo)["add"].checkState(0) == Qt.Unchecked
        demo.setCheckState(0, Qt.Unchecked)  # off: its tools cannot be chosen, the choice of them is kept
        assert not items(section.tree, demo)["lookup"].flags() & Qt.ItemIsEnabled
        assert ember.chat_store.get_chat(view.chat_id).settings["mcp_servers"] == ["ghost"]
        assert "mcp_servers" not in ember.chat_store.get_chat(other.chat_id).settings
        running = server_processes()
        assert len(running) == 1  # demo's, started once
    finally:
        ember.shutdown()
    gone, alive = psutil.wait_procs(running, timeout=30)
    assert not alive, "the MCP server outlived the app"


def test_no_servers_yet_points_to_settings(qtbot, tmp_path):
    ember = build_app(make_settings(tmp_path / "app"))
    qtbot.addWidget(ember.window)
    try:
        section = ember.window.settings_panel.tools
        assert section.note.text() == "No MCP servers yet. Add them in Settings → Tools." and section.tree.isHidden()
        section.configure.click()  # the window is not shown: a click, not a mouse event
        dialog = ember.settings_dialog
        assert dialog.tabs.currentWidget() is dialog.tools_page and dialog.tools_page.tools is ember.chat_tools
        dialog.reject()
    finally:
        ember.shutdown()


STEP = ToolStep("call_1", "lookup", '{"key": "<b>ada</b>", "n": [1, 2]}', server="demo", tool="lookup")
TOOL = ToolInfo("demo", "lookup", "Look up <i>a value</i> & more.", {"type": "object"})


def answer_with(qtbot, act) -> None:
    """Once the modal dialog is up (exec runs its own loop), act on it."""
    def attempt():
        dialog = QApplication.activeModalWidget()
        if isinstance(dialog, ToolApprovalDialog) and dialog.isVisible():
            act(dialog)
        else:
            QTimer.singleShot(20, attempt)
    QTimer.singleShot(0, attempt)


@pytest.mark.parametrize("act, expected", [
    (lambda q, d: d.once.click(), Approval.ONCE),
    (lambda q, d: d.always.click(), Approval.ALWAYS),
    (lambda q, d: d.deny.click(), Approval.DENY),
    (lambda q, d: q.keyClick(d, Qt.Key_Escape), Approval.DENY),
    (lambda q, d: q.keyClick(d, Qt.Key_Return), Approval.DENY),  # an Enter meant for the message box
    (lambda q, d: d.close(), Approval.DENY),
], ids=["once", "always", "deny", "escape", "enter", "close"])
def test_the_approval_dialog_answers(qtbot, act, expected):
    answer_with(qtbot, lambda d: act(qtbot, d))
    assert ask_approval(None, STEP, TOOL) is expected


def test_the_approval_dialog_shows_plain_text(qtbot):
    dialog = ToolApprovalDialog(STEP, TOOL)
    qtbot.addWidget(dialog)
    assert dialog.arguments.toPlainText() == '{\n  "key": "<b>ada</b>",\n  "n": [\n    1,\n    2\n  ]\n}'
    assert dialog.arguments.isReadOnly()
    for label in (dialog.heading, dialog.description):
        assert label.textFormat() == Qt.PlainText
    assert dialog.description.text() == "Look up <i>a value</i> & more."
    assert dialog.heading.text() == "The model wants to call lookup on the MCP server demo."
    assert dialog.deny.isDefault() and not dialog.once.isDefault()
    bad = ToolApprovalDialog(ToolStep("c", "lookup", '{"key": ', server="demo", tool="lookup"), TOOL)
    qtbot.addWidget(bad)
    assert bad.arguments.toPlainText() == '{"key": '  # not JSON: the model's text as it is
