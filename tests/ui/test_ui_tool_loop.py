"""A chat with MCP tools, end to end and offscreen: a real engine serving scripted tool-calling models
(each one's greedy reply is one call, then a fixed answer once the prompt ends with a tool result in
the template's format), the real MCP test server over stdio, and the real chat view. The approver is
injected (the dialog is ui/tool_approval.py's); it runs on the GUI thread as the dialog would."""
from __future__ import annotations

import json
import threading

import pytest
from PySide6.QtGui import QColor

from app.agent.chat_tools import ChatTools
from app.agent.steps import Approval, CallStatus, ToolStep
from app.history import ChatStore
from app.store import ModelStore
from mcp_test_server import lookup_value
from mcp_util import stdio_server_entry
from scripted_gguf import TOOL_ANSWER, write_tool_model
from test_ui_messages import click_link
from ui.chat_view import ChatView
from ui.engine_controller import EngineController
from ui.transcript import FAILED_COLOUR, TranscriptView
from ui.transcript_message import TranscriptMessage, api_messages
from ui_support import make_settings, start_engine

pytestmark = pytest.mark.timeout(300)

CALLS = {"lookup": {"name": "lookup", "arguments": {"key": "door"}},
         "bad-args": {"name": "add", "arguments": {"a": "one", "b": 2}},
         "sleeper": {"name": "sleep", "arguments": {"seconds": 60}},
         "crasher": {"name": "crash", "arguments": {}},
         "big": {"name": "big", "arguments": {"n": 200000}}}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("tool-engine")
    settings = make_settings(root / "ember")
    store = ModelStore(settings.models_dir)
    for model_id, call in CALLS.items():
        store.import_path(write_tool_model(root / f"{model_id}.gguf", call, ctx=2048), model_id=model_id, mode="link")
    sup = start_engine(settings, store.get("lookup").path, extra_args=("--max-loaded-models", "8"))
    yield sup
    sup.stop()


class Kit:
    """A chat store, the app's servers (mcp.json: `notes`, and `broken`, which never starts) and an engine
    controller on the shared engine; `view` opens a chat on one scripted model."""

    def __init__(self, qtbot, tmp_path, engine, **settings) -> None:
        self.qtbot, self.mcp_json = qtbot, tmp_path / "mcp.json"
        self.mcp_json.write_text(json.dumps({"mcpServers": {"notes": stdio_server_entry(),
                                                            "broken": stdio_server_entry(MCP_TEST_FAIL_START="1")}}))
        self.tools = ChatTools(self.mcp_json)
        self.store = ChatStore(tmp_path / "chats.sqlite3")
        self.controller = EngineController(make_settings(tmp_path / "app", **settings), engine)
        self.controller.start()
        qtbot.waitUntil(lambda: self.controller.last_status.get("status") == "ready", timeout=60_000)

    def view(self, model: str, approver, servers=("notes",), chat: int | None = None) -> ChatView:
        if chat is None:
            chat = self.store.create_chat(model, model=model, settings={"temperature": 0, "max_tokens": 64,
                                                                        "mcp_servers": list(servers)})
        view = ChatView(self.store, chat, self.controller, tools=self.tools, approver=approver)
        self.qtbot.addWidget(view)
        view.resize(900, 700)
        view.show()
        return view

    def close(self) -> None:
        self.controller.close()
        self.tools.close()
        self.store.close()


@pytest.fixture
def kit(qtbot, tmp_path, engine):
    k = Kit(qtbot, tmp_path, engine, tool_timeout_s=2.0)
    yield k
    k.close()


def send(qtbot, view: ChatView, text: str = "What is stored under door?", status: str = "done") -> None:
    with qtbot.waitSignal(view.reply_finished, timeout=120_000) as done:
        view.send(text)
    assert done.args == [view.chat_id, status], view.transcript.messages[-1].error


def only_step(view: ChatView) -> ToolStep:
    (step,) = [s for m in view.transcript.messages for s in m.steps]
    return step


def colour_of(view: TranscriptView, text: str) -> str:
    cursor = view.document().find(text)
    assert not cursor.isNull(), f"{text!r} is not shown"
    return cursor.charFormat().foreground().color().name()


def test_a_call_runs_is_shown_stored_sent_back_reopened_and_exported(qtbot, kit):
    asked = []
    view = kit.view("lookup", lambda step, tool: asked.append((tool.server, step.name, step.arguments_object()))
                    or pending.append(view._reply.pending) or Approval.ALWAYS)
    pending = []
    send(qtbot, view)
    assert pending == [""]  # while asked, the reply shows its call, not what it waited for before
    user, call, answer = view.transcript.messages  # the reply that called, then the one after its result
    step = only_step(view)
    assert asked == [("notes", "lookup", {"key": "door"})]
    assert (step.status, step.result, answer.content) == (CallStatus.OK, lookup_value("door"), TOOL_ANSWER)
    assert answer.ttft > 0 and view.info_label.text().count("first token 0 ms") == 0  # from its own request
    text = view.transcript.toPlainText()
    assert "notes · lookup · ok · " in text and lookup_value("door") not in text  # collapsed to its line
    click_link(qtbot, view.transcript, "notes · lookup · ok")
    assert lookup_value("door") in view.transcript.toPlainText() and '"key": "door"' in view.transcript.toPlainText()
    assert colour_of(view.transcript, "notes · lookup · ok") != QColor(FAILED_COLOUR).name()

    stored = kit.store.messages(view.chat_id)
    assert [(m.role, [s.result for s in m.tool_steps]) for m in stored] == [
        ("user", []), ("assistant", [lookup_value("door")]), ("assistant", [])]
    sent = api_messages(view.transcript.messages, None)  # what the next turn sends
    assert sent[1]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": step.arguments}
    assert sent[2] == {"role": "tool", "tool_call_id": step.call_id, "name": "lookup", "content": lookup_value("door")}

    assert json.loads(kit.mcp_json.read_text())["mcpServers"]["notes"]["autoApprove"] == ["lookup"]
    send(qtbot, view, "And once more?")  # the earlier round goes through the template; "always": not asked
    assert len(asked) == 1 and view.transcript.messages[-1].content == TOOL_ANSWER

    reopened = kit.view("lookup", None, chat=view.chat_id)
    assert reopened.transcript.toPlainText().count("notes · lookup · ok · ") == 2
    md = kit.store.export_markdown(view.chat_id)
    assert md.count(lookup_value("door")) == 2 and '"key": "door"' in md and TOOL_ANSWER in md


def test_a_denied_call_and_invalid_arguments_go_back_to_the_model(qtbot, kit):
    denied = kit.view("lookup", lambda step, tool: Approval.DENY)
    send(qtbot, denied)
    step = only_step(denied)
    assert step.status is CallStatus.DENIED and "denied" in step.result
    assert denied.transcript.messages[-1].content == TOOL_ANSWER  # the refusal reached the model
    assert colour_of(denied.transcript, "notes · lookup · denied") == QColor(FAILED_COLOUR).name()

    asked = []
    invalid = kit.view("bad-args", lambda step, tool: asked.append(step) or Approval.ONCE)
    kit.controller.settings.tool_step_limit = 1  # the reply after the first round's results gets no tools
    send(qtbot, invalid)
    assert "tool step limit (1) is reached" in invalid.transcript.toPlainText()
    step = only_step(invalid)
    assert asked == [] and step.status is CallStatus.INVALID  # never asked about, never sent to the server
    assert step.result.startswith("error: invalid arguments at a") and "not called" in step.result
    assert invalid.transcript.messages[-1].content == TOOL_ANSWER


def test_timeout_oversized_result_and_crash_leave_the_chat_working(qtbot, kit):
    sleeper = kit.view("sleeper", lambda step, tool: Approval.ONCE, servers=("notes", "broken"))
    send(qtbot, sleeper)
    assert only_step(sleeper).status is CallStatus.TIMEOUT and "2 s" in only_step(sleeper).result
    notice = sleeper.transcript.messages[1].notices
    assert len(notice) == 1 and "'broken' is unavailable" in notice[0]
    assert "'broken' is unavailable" in sleeper.transcript.toPlainText()
    assert sleeper.transcript.messages[-1].content == TOOL_ANSWER
    send(qtbot, sleeper, "Again?")  # the server is still failed: the chat said so once
    assert sleeper.transcript.toPlainText().count("'broken' is unavailable") == 1

    big = kit.view("big", lambda step, tool: Approval.ONCE)
    send(qtbot, big)
    step = only_step(big)
    assert step.status is CallStatus.OK and step.truncated and "cut: the result was 200,000 characters" in step.result
    click_link(qtbot, big.transcript, "notes · big · ok")
    assert "(cut to fit the context)" in big.transcript.toPlainText() and "200,000" in big.transcript.toPlainText()
    assert big.transcript.messages[-1].content == TOOL_ANSWER

    crasher = kit.view("crasher", lambda step, tool: Approval.ONCE)
    send(qtbot, crasher)
    assert only_step(crasher).status is CallStatus.UNAVAILABLE
    assert colour_of(crasher.transcript, "notes · crash · unavailable") == QColor(FAILED_COLOUR).name()
    assert crasher.transcript.messages[-1].content == TOOL_ANSWER


def test_stop_while_the_user_is_asked_stops_cleanly(qtbot, kit):
    held = {}

    def stop_then_allow(step, tool):  # the user stops the reply while the question is up, then answers late
        assert "notes · lookup · waiting for approval" in view.transcript.toPlainText()
        held["worker"], held["thread"] = view._worker, threading.current_thread()
        view.stop()
        return Approval.ONCE

    view = kit.view("lookup", stop_then_allow)
    send(qtbot, view, status="stopped")
    assert held["thread"] is threading.main_thread() and held["worker"].join(30)  # the loop's thread ended
    step = only_step(view)
    assert step.status is CallStatus.CANCELLED and kit.store.messages(view.chat_id)[1].tool_steps == [step]
    view.agent._approver = lambda step, tool: Approval.ONCE
    send(qtbot, view, "Try again?")  # nothing hangs: the next turn runs
    assert view.transcript.messages[-1].content == TOOL_ANSWER


def test_a_long_result_shows_its_start_until_show_all(qtbot):
    view = TranscriptView()
    qtbot.addWidget(view)
    view.resize(900, 700)
    view.show()
    result = "".join(f"line {n}\n" for n in range(400))
    step = ToolStep("c1", "lookup", "{}", "notes", "lookup", CallStatus.OK, result, 0.1)
    view.set_messages([TranscriptMessage("user", "hi"), TranscriptMessage("assistant", "", steps=[step], opened={0})])
    assert "line 29" in view.toPlainText() and "line 30" not in view.toPlainText()
    click_link(qtbot, view, f"show all ({len(result):,} characters)")
    assert "line 399" in view.toPlainText()
    click_link(qtbot, view, "show less")
    assert "line 399" not in view.toPlainText()
    click_link(qtbot, view, "notes · lookup · ok")  # closed again: one line
    assert "line 0" not in view.toPlainText()


def test_nothing_from_a_tool_is_rendered_as_html(qtbot):
    hostile = "<b>bold?</b> <img src=x> ```\n# heading?\n[link](http://x) <script>alert(1)</script>"
    step = ToolStep("c1", "lookup", json.dumps({"key": "<i>k</i> ```"}), "<b>srv</b>", "look`up", CallStatus.ERROR,
                    hostile, 0.5)
    view = TranscriptView()
    qtbot.addWidget(view)
    reply = TranscriptMessage("assistant", "", steps=[step], notices=["<b>server</b> said <i>no</i>"], opened={0})
    view.set_messages([TranscriptMessage("user", "hi"), reply])
    lines = view.toPlainText().split("\n")
    for line in hostile.split("\n") + ["<b>srv</b> · look`up · error · 0.5 s", '  "key": "<i>k</i> ```"']:
        assert any(line in shown for shown in lines), f"{line!r} was not shown as written"
    assert "⚠ <b>server</b> said <i>no</i>" in lines
    assert colour_of(view, "<b>srv</b> · look`up · error") == QColor(FAILED_COLOUR).name()


def test_the_whole_app_asks_in_its_dialog_and_runs_the_call(qtbot, tmp_path, engine):
    """build_app's own ChatTools (mcp.json beside the settings) reaches the window's chats, and the
    real approval dialog answers the loop: a click on "Allow once"."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.agent.chat_tools import config_path
    from app.gui_main import build_app
    from ui.tool_approval import ToolApprovalDialog

    settings = make_settings(tmp_path / "app")
    config_path(settings).parent.mkdir(parents=True, exist_ok=True)
    config_path(settings).write_text(json.dumps({"mcpServers": {"notes": stdio_server_entry()}}))
    app = build_app(settings, supervisor=engine)
    qtbot.addWidget(app.window)
    app.controller.start()
    try:
        qtbot.waitUntil(lambda: app.controller.last_status.get("status") == "ready", timeout=60_000)
        chat = app.chat_store.create_chat("tools", model="lookup", settings={
            "temperature": 0, "max_tokens": 64, "mcp_servers": ["notes"]})
        view = app.window.open_chat(chat)
        seen = []

        def allow():
            dialog = QApplication.activeModalWidget()
            if isinstance(dialog, ToolApprovalDialog) and dialog.isVisible():
                seen.append(dialog.windowTitle())
                dialog.once.click()
            else:
                QTimer.singleShot(20, allow)
        QTimer.singleShot(0, allow)
        send(qtbot, view)
        assert seen and only_step(view).result == lookup_value("door")
        assert view.transcript.messages[-1].content == TOOL_ANSWER
    finally:  # not shutdown(): the engine is this module's
        app.controller.close()
        app.chat_tools.close()
        app.chat_store.close()


def test_a_slash_command_runs_the_servers_prompt_and_a_resource_attaches(qtbot, kit):
    from mcp_test_server import NOTES_TEXT, NOTES_URI

    view = kit.view("lookup", lambda step, tool: Approval.DENY)
    send(qtbot, view, "/review")  # the prompt needs its topic: said, and nothing goes to the model
    assert "/review needs topic: /review topic=…" in view.transcript.messages[-1].notices
    assert not view.transcript.messages[-1].steps

    send(qtbot, view, "/review the launch plan")
    asked = view.transcript.messages[-3]  # the user's line, then the reply that called and the answer
    assert asked.role == "user" and "Please review the launch plan" in asked.content
    stored = {m.id: m for m in kit.store.messages(view.chat_id)}
    assert stored[asked.msg_id].content == asked.content  # stored as the prompt's text, sent so next turn too
    send(qtbot, view, "/nothing like that")  # no such prompt: sent as typed
    assert any(m.content == "/nothing like that" for m in view.transcript.messages)

    button = view.attach_button
    view.input.setPlainText("Summarise this.")
    button.menu_.aboutToShow.emit()
    (action,) = [a for a in button.menu_.actions() if NOTES_URI in a.text()]
    action.trigger()
    qtbot.waitUntil(lambda: NOTES_TEXT in view.input.toPlainText(), timeout=30_000)
    assert view.input.toPlainText().startswith(f"Summarise this.\n\n[resource {NOTES_URI}]\n```")
