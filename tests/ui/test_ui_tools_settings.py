"""Settings -> Tools against real MCP servers (tests/mcp_test_server.py, started by the app over stdio):
a server added in the form is written to mcp.json and Start lists its tools; a missing command fails
in words; Claude Desktop's servers import; a broken mcp.json says why; disable and remove. Offscreen."""
from __future__ import annotations

import json
import shlex
import sys

import pytest
from PySide6.QtCore import Qt

from app.agent.chat_tools import ChatTools, config_path
from app.agent.mcp_config import parse_server
from mcp_util import SERVER_SCRIPT, stdio_server_entry
from ui.mcp_states import ServerStates
from ui.settings_dialog import SettingsDialog
from ui_support import ui_settings  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(180)
TOOLS = ["lookup", "add", "sleep", "crash", "big", "fail"]
START_MS = 60_000


@pytest.fixture
def page(qtbot, ui_settings):  # noqa: F811
    """Settings -> Tools over a ChatTools of its own (mcp.json in the test's config folder)."""
    states = ServerStates()
    tools = ChatTools(config_path(ui_settings), on_change=states.report)
    dialog = SettingsDialog(ui_settings, tools=tools, tool_states=states)
    qtbot.addWidget(dialog)
    dialog.tabs.setCurrentWidget(dialog.tools_page)
    yield dialog.tools_page
    tools.close()


def row(page, name: str):
    found = [page.tree.topLevelItem(i) for i in range(page.tree.topLevelItemCount())
             if page.tree.topLevelItem(i).text(0) == name]
    return found[0] if found else None


def select(page, name: str) -> None:
    page.tree.setCurrentItem(row(page, name))


def saved(page) -> dict:
    return json.loads(page.tools.path.read_text())["mcpServers"]


def test_a_server_added_in_the_form_is_saved_and_start_lists_its_tools(qtbot, page):
    assert "No MCP servers yet" in page.details.text()
    qtbot.mouseClick(page.add_button, Qt.LeftButton)
    form = page.form
    qtbot.keyClicks(form.name, "demo")
    form.accept()  # no command: refused in mcp_config's words, the form stays open
    assert "either a \"command\"" in form.error.text() and form.isVisible() and not page.tools.path.exists()
    form.http.setChecked(True)
    assert not form.form.isRowVisible(form.command) and form.form.isRowVisible(form.url)
    qtbot.keyClicks(form.url, "ftp://example.com")
    form.accept()
    assert "http:// or https://" in form.error.text()
    form.stdio.setChecked(True)
    qtbot.keyClicks(form.command, sys.executable)
    qtbot.keyClicks(form.args, shlex.join([str(SERVER_SCRIPT), "stdio"]))
    form.env.setPlainText("MCP_TEST_NAME=demo")
    form.accept()
    assert not form.isVisible()
    assert saved(page)["demo"] == {"command": sys.executable, "args": [str(SERVER_SCRIPT), "stdio"],
                                   "env": {"MCP_TEST_NAME": "demo"}}
    assert row(page, "demo").text(1) == "not started" and page.selected_name() == "demo"
    qtbot.mouseClick(page.start_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: row(page, "demo").text(1) == "ready, 6 tools", timeout=START_MS)
    item = row(page, "demo")
    assert [item.child(i).text(0) for i in range(item.childCount())] == TOOLS
    assert "ready, 6 tools" in page.details.text() and str(SERVER_SCRIPT) in page.details.text()
    qtbot.waitUntil(lambda: page.message.text() == "demo: ready, 6 tools")
    qtbot.mouseClick(page.start_button, Qt.LeftButton)  # again: it runs already
    assert page.message.text() == "demo is running: ready, 6 tools"


def test_a_missing_command_fails_in_words_and_edit_fixes_it(qtbot, page):
    page.tools.save({"ghost": parse_server("ghost", {"command": "/nonexistent/ember-mcp-ghost", "args": ["-x"]})})
    page.refresh()
    select(page, "ghost")
    qtbot.mouseClick(page.start_button, Qt.LeftButton)
    words = "failed: command not found: /nonexistent/ember-mcp-ghost"
    qtbot.waitUntil(lambda: row(page, "ghost").text(1) == words, timeout=START_MS)
    assert words in page.details.text()
    qtbot.waitUntil(lambda: page.message.text() == "ghost: " + words)
    page.tools.allow_always("ghost", "lookup")
    qtbot.mouseClick(page.edit_button, Qt.LeftButton)  # the form holds the server as saved
    form = page.form
    assert (form.name.text(), form.command.text(), form.args.text()) == ("ghost", "/nonexistent/ember-mcp-ghost", "-x")
    form.command.setText(sys.executable)
    form.args.setText(shlex.join([str(SERVER_SCRIPT), "stdio"]))
    form.name.setText("echo")  # renamed: its autoApprove goes with it
    form.accept()
    assert list(saved(page)) == ["echo"] and saved(page)["echo"]["autoApprove"] == ["lookup"]
    select(page, "echo")
    qtbot.mouseClick(page.start_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: row(page, "echo").text(1) == "ready, 6 tools", timeout=START_MS)
    assert row(page, "echo").child(0).text(1) == "always allowed"


def test_import_from_claude_desktop(qtbot, page, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("APPDATA", str(tmp_path / "appdata"))
    from app.agent.mcp_config import claude_desktop_config_path
    claude = claude_desktop_config_path()
    assert str(tmp_path) in str(claude)
    qtbot.mouseClick(page.import_button, Qt.LeftButton)
    assert page.message.text() == f"No Claude Desktop configuration was found (looked for {claude})."
    page.tools.save({"demo": parse_server("demo", stdio_server_entry())})
    claude.parent.mkdir(parents=True)
    claude.write_text(json.dumps({"globalShortcut": "", "mcpServers": {
        "demo": {"command": "other"}, "files": {"command": "npx", "args": ["-y", "server-filesystem", "/tmp"]},
        "web": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer k"}}}}))
    qtbot.mouseClick(page.import_button, Qt.LeftButton)
    assert page.message.text() == "Imported files, web from Claude Desktop. Already here: demo."
    servers = saved(page)
    assert list(servers) == ["demo", "files", "web"] and servers["demo"]["command"] == sys.executable
    assert servers["web"] == {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer k"}}
    assert [row(page, n).text(1) for n in servers] == ["not started"] * 3
    qtbot.mouseClick(page.import_button, Qt.LeftButton)
    assert page.message.text() == f"Nothing new in {claude}. Already here: demo, files, web."


def test_a_broken_mcp_json_says_why_until_it_is_fixed(qtbot, ui_settings):  # noqa: F811
    path = config_path(ui_settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"mcpServers": {"demo": {"command": "x",}}}')
    states = ServerStates()
    tools = ChatTools(path, on_change=states.report)
    try:
        dialog = SettingsDialog(ui_settings, tools=tools, tool_states=states)
        qtbot.addWidget(dialog)
        page = dialog.tools_page
        assert not page.error.isHidden() and "is not valid JSON (line 1" in page.error.text()
        assert page.tree.topLevelItemCount() == 0 and not page.add_button.isEnabled()  # no overwriting it
        path.write_text(json.dumps({"mcpServers": {"demo": stdio_server_entry()}}))
        qtbot.mouseClick(page.reload_button, Qt.LeftButton)
        assert page.error.isHidden() and page.add_button.isEnabled() and row(page, "demo").text(1) == "not started"
    finally:
        tools.close()


def test_disable_enable_and_remove(qtbot, page):
    page.tools.save({"demo": parse_server("demo", stdio_server_entry()), "other": parse_server("other", {"command": "x"})})
    page.refresh()
    select(page, "demo")
    assert page.toggle_button.text() == "Disable"
    qtbot.mouseClick(page.toggle_button, Qt.LeftButton)
    assert saved(page)["demo"]["disabled"] is True and row(page, "demo").text(1) == "disabled"
    assert page.toggle_button.text() == "Enable" and not page.start_button.isEnabled()
    qtbot.mouseClick(page.toggle_button, Qt.LeftButton)
    assert "disabled" not in saved(page)["demo"] and row(page, "demo").text(1) == "not started"
    qtbot.mouseClick(page.remove_button, Qt.LeftButton)
    page.confirm.button(page.confirm.StandardButton.No).click()
    assert list(saved(page)) == ["demo", "other"]
    qtbot.mouseClick(page.remove_button, Qt.LeftButton)
    page.confirm.button(page.confirm.StandardButton.Yes).click()
    assert list(saved(page)) == ["other"] and row(page, "demo") is None and page.message.text() == "Removed demo."


def test_the_limits_save_with_the_dialog(qtbot, ui_settings):  # noqa: F811
    ui_settings.save()
    dialog = SettingsDialog(ui_settings)  # no ChatTools: the limits alone
    qtbot.addWidget(dialog)
    page = dialog.tools_page
    assert (page.step_limit.value(), page.timeout.value()) == (10, 60.0)
    page.step_limit.setValue(4)
    page.timeout.setValue(90)
    dialog.accept()
    stored = json.loads(ui_settings.path.read_text())
    assert (stored["tool_step_limit"], stored["tool_timeout_s"]) == (4, 90.0)


@pytest.mark.skipif(sys.platform == "win32", reason="the installed program is a shell script")
def test_start_retries_a_failed_server(qtbot, page, tmp_path):
    program = tmp_path / "bin" / "notes-server"
    page.tools.save({"notes": parse_server("notes", {"command": str(program)})})
    page.refresh()
    select(page, "notes")
    qtbot.mouseClick(page.start_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: row(page, "notes").text(1) == f"failed: command not found: {program}", timeout=START_MS)
    program.parent.mkdir()  # the user installs it, and presses Start again: no edit needed
    program.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(SERVER_SCRIPT))} stdio\n")
    program.chmod(0o755)
    qtbot.mouseClick(page.start_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: row(page, "notes").text(1) == "ready, 6 tools", timeout=START_MS)
