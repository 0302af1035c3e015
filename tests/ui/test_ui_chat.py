"""The chat window against a real engine process on a tiny generated model (pytest-qt, offscreen)."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from PySide6.QtCore import Qt

from app.client import EngineClient
from app.gui_main import build_app
from ui.chat_view import ChatView
from ui.status_poll import IDLE_POLL_FACTOR
from ui.transcript import TranscriptView
from server_util import long_max_tokens
from ui_support import GapMeter, allowed_gap_ms, ember, make_settings, record_client_threads, own_engine, replies_ignore_eos, shared_engine, tiny_gguf, ui_settings  # noqa: F401

pytestmark = pytest.mark.timeout(300)

GREEDY_LONG = {"temperature": 0.0, "max_tokens": 60}


def new_chat(app, **settings) -> ChatView:
    view = app.window.new_chat()
    app.chat_store.update_chat_settings(view.chat_id, {**GREEDY_LONG, **settings})
    return view


def record_widget_threads(monkeypatch) -> list[int]:
    """Record the thread of every transcript update a streamed token causes (the widget side).

    (Wrapping the slot itself would hide `sender()` from it, so the widget method is wrapped.)
    """
    seen: list[int] = []
    original = TranscriptView.schedule_render

    def wrapped(self):
        seen.append(threading.get_ident())
        return original(self)

    monkeypatch.setattr(TranscriptView, "schedule_render", wrapped)
    return seen


def test_reply_streams_in_and_matches_a_plain_request(qtbot, ember, monkeypatch):
    threads = record_widget_threads(monkeypatch)
    view = new_chat(ember)
    lengths = []
    view.reply_stats.connect(lambda s: lengths.append(len(view.transcript.messages[-1].content)))
    qtbot.keyClicks(view.input, "Hello there")
    with qtbot.waitSignal(view.reply_finished, timeout=120_000) as done:
        qtbot.keyClick(view.input, Qt.Key_Return)
        assert view.is_streaming and not view.send_button.isEnabled() and view.stop_button.isEnabled()
    assert done.args == [view.chat_id, "done"], view.transcript.messages[-1].error
    assert len(set(lengths)) > 3, "the reply should arrive in many steps, not at once"
    assert threads and set(threads) == {threading.get_ident()}, "a widget was touched from a worker thread"

    msgs = ember.chat_store.messages(view.chat_id)
    assert [(m.role, m.status) for m in msgs] == [("user", "done"), ("assistant", "done")]
    reply = msgs[1].content
    assert reply and view.transcript.messages[-1].content == reply
    # Oracle: the same greedy request without streaming gives the same text.
    client = EngineClient(ember.controller.base_url, api_key=ember.controller.api_key)
    plain = client.chat([{"role": "user", "content": "Hello there"}], **GREEDY_LONG)
    assert plain.text == reply
    assert msgs[1].tok_s and msgs[1].tok_s > 0 and msgs[1].ttft is not None
    assert "tok/s" in view.info_label.text()
    assert ember.chat_store.get_chat(view.chat_id).title == "Hello there"


def test_two_chats_stream_at_once(qtbot, ember, monkeypatch):
    replies_ignore_eos(monkeypatch)  # two replies of seconds each: they overlap on any CPU
    n = long_max_tokens(ember.controller.base_url, ember.controller.api_key, seconds=2)
    a, b = new_chat(ember, max_tokens=n), new_chat(ember, max_tokens=n)
    both = []

    def check(_stats):
        if a.is_streaming and b.is_streaming and a.transcript.messages[-1].content \
                and b.transcript.messages[-1].content:
            rows = ember.window.chat_list.list
            marked = [rows.item(i).text().startswith("● ") for i in range(rows.count())]
            both.append(marked.count(True) == 2)

    a.reply_stats.connect(check)
    b.reply_stats.connect(check)
    with qtbot.waitSignals([a.reply_finished, b.reply_finished], timeout=180_000):
        a.send("Tell me a story about a fox.")
        b.send("Count from one to fifty.")
    assert both, "the two replies never streamed at the same time"
    assert all(both), "the chat list should mark both chats as replying"
    assert not any(ember.window.chat_list.list.item(i).text().startswith("● ")
                   for i in range(ember.window.chat_list.list.count()))
    for v in (a, b):
        assert ember.chat_store.messages(v.chat_id)[-1].status == "done"


def test_stop_ends_the_reply_and_frees_the_sequence(qtbot, ember, monkeypatch):
    replies_ignore_eos(monkeypatch)  # still running when Stop is clicked, however fast the CPU
    n = long_max_tokens(ember.controller.base_url, ember.controller.api_key)
    view = new_chat(ember, max_tokens=n, temperature=0.8)
    view.send("Write a very long essay.")
    qtbot.waitUntil(lambda: len(view.transcript.messages[-1].content) > 10, timeout=60_000)
    with qtbot.waitSignal(view.reply_finished, timeout=5000) as stopped:
        qtbot.mouseClick(view.stop_button, Qt.LeftButton)
    assert stopped.args == [view.chat_id, "stopped"]
    text = view.transcript.messages[-1].content
    client = EngineClient(ember.controller.base_url, api_key=ember.controller.api_key)
    qtbot.waitUntil(lambda: client.status().get("num_running", 0) == 0, timeout=10_000)
    qtbot.wait(500)  # the engine has ended the sequence: nothing it sent may show up now
    assert view.transcript.messages[-1].content == text, "text kept arriving after Stop"
    assert ember.chat_store.messages(view.chat_id)[-1].status == "stopped"
    assert "(stopped)" in view.transcript.toPlainText()
    assert view.send_button.isEnabled() and view.regenerate_button.isEnabled()


def test_event_loop_keeps_turning_while_a_reply_streams(qtbot, ember, monkeypatch):
    calls = record_client_threads(monkeypatch)
    replies_ignore_eos(monkeypatch)  # a reply of about a second on any CPU, so the timer can tick
    view = new_chat(ember, max_tokens=long_max_tokens(ember.controller.base_url, ember.controller.api_key, seconds=1))
    meter = GapMeter(20)
    meter.start()
    t0 = time.perf_counter()
    with qtbot.waitSignal(view.reply_finished, timeout=120_000):
        view.send("Say something long.")
    elapsed_ms = 1000 * (time.perf_counter() - t0)
    meter.stop()
    # The timer fired at least half as often as it would on an idle loop (a fast reply is short).
    assert len(meter.ticks) >= max(3, 0.5 * elapsed_ms / 20), (len(meter.ticks), elapsed_ms)
    assert "worker" in calls and "gui" not in calls, "an HTTP call ran on the GUI thread"
    limit = allowed_gap_ms()
    assert meter.max_gap_ms < limit, f"the GUI thread was blocked for {meter.max_gap_ms:.0f} ms (limit {limit:.0f})"


def test_engine_killed_mid_reply(qtbot, tmp_path, own_engine, monkeypatch):  # noqa: F811
    replies_ignore_eos(monkeypatch)
    app = build_app(own_engine.settings, supervisor=own_engine, poll_interval_ms=200)
    qtbot.addWidget(app.window)
    app.controller.start()
    try:
        first = new_chat(app, max_tokens=20)
        with qtbot.waitSignal(first.reply_finished, timeout=60_000):
            first.send("An earlier question")
        view = new_chat(app, max_tokens=long_max_tokens(own_engine.base_url, own_engine.api_key))
        view.send("Hello there")  # seconds of reply on any CPU: still running when the kill comes
        qtbot.waitUntil(lambda: len(view.transcript.messages[-1].content) > 5 or not view.is_streaming,
                        timeout=60_000)
        assert view.is_streaming, f"the reply ended before the kill: {view.transcript.messages[-1]}"
        pid = own_engine.pid
        with qtbot.waitSignal(view.reply_finished, timeout=30_000) as failed:
            os.kill(pid, signal.SIGKILL)
        assert failed.args == [view.chat_id, "error"]
        assert "Error" in view.transcript.toPlainText()
        qtbot.waitUntil(lambda: own_engine.state == "ready" and own_engine.pid not in (None, pid), timeout=120_000)
        qtbot.waitUntil(lambda: app.controller.state == "ready", timeout=10_000)
        # nothing else was lost: both chats and their turns are still there
        assert [m.status for m in app.chat_store.messages(first.chat_id)] == ["done", "done"]
        assert [m.status for m in app.chat_store.messages(view.chat_id)] == ["done", "error"]
        app.chat_store.update_chat_settings(view.chat_id, {"max_tokens": 20})  # a short one this time
        with qtbot.waitSignal(view.reply_finished, timeout=60_000) as again:
            view.regenerate_button.click()
        assert again.args == [view.chat_id, "done"]
        assert [m.role for m in app.chat_store.messages(view.chat_id)] == ["user", "assistant"]
    finally:
        for v in app.window._views.values():
            v.stop()
        app.controller.close()
        app.chat_store.close()


def test_event_loop_keeps_turning_while_the_engine_loads(qtbot, ui_settings, tiny_gguf, monkeypatch):  # noqa: F811
    from app.supervisor import EngineSupervisor

    calls = record_client_threads(monkeypatch)
    sup = EngineSupervisor(ui_settings, model_path=tiny_gguf, port=0)
    app = build_app(ui_settings, supervisor=sup, poll_interval_ms=100)
    qtbot.addWidget(app.window)
    app.window.show()
    meter = GapMeter(20)
    try:
        meter.start()
        t0 = time.perf_counter()
        app.controller.start()
        qtbot.waitUntil(lambda: app.window.status.loading.isVisible(), timeout=10_000)
        qtbot.waitUntil(lambda: app.controller.state == "ready", timeout=180_000)
        # the process answers before its model has loaded (/health says "loading" meanwhile):
        # the indicator goes once the model serves
        qtbot.waitUntil(lambda: not app.window.status.loading.isVisible(), timeout=60_000)
        meter.stop()
        assert time.perf_counter() - t0 > 0.3
        assert "worker" in calls and "gui" not in calls, "an HTTP call ran on the GUI thread"
        limit = allowed_gap_ms()
        assert meter.max_gap_ms < limit, f"the GUI thread was blocked for {meter.max_gap_ms:.0f} ms (limit {limit:.0f})"
    finally:
        app.controller.shutdown()
        app.chat_store.close()


def test_remote_openai_compatible_connection(qtbot, tmp_path, shared_engine):  # noqa: F811
    """With a connection URL and key the app talks to that server and starts no engine of its own."""
    settings = make_settings(tmp_path / "remote", connection_url=shared_engine.base_url + "/v1",
                             connection_key=shared_engine.api_key)
    app = build_app(settings, poll_interval_ms=200)
    qtbot.addWidget(app.window)
    app.controller.start()
    try:
        assert app.controller.state == "remote" and app.controller.supervisor.state == "stopped"
        qtbot.waitUntil(lambda: app.controller.last_status.get("status") == "ready", timeout=10_000)
        view = new_chat(app, max_tokens=12)
        with qtbot.waitSignal(view.reply_finished, timeout=60_000) as done:
            view.send("Hello there")
        assert done.args == [view.chat_id, "done"] and view.transcript.messages[-1].content
        assert app.controller.supervisor.pid is None
        app.tray.menu.aboutToShow.emit()
        texts = app.tray.action_texts()
        assert f"Server: {shared_engine.base_url}/v1" in texts and "Stop server" not in texts
    finally:
        app.controller.close()
        app.chat_store.close()


def test_an_idle_engine_is_polled_less_often_until_a_chat_sends(ember, qtbot):
    """Issue 20's idle CPU: nothing to show, fewer status requests; a message wakes the poll."""
    controller = ember.controller
    qtbot.waitUntil(lambda: controller.poll_interval_ms == 200 * IDLE_POLL_FACTOR, timeout=30_000)
    polled_at = controller.last_status.get("polled_at")
    view = new_chat(ember)
    with qtbot.waitSignal(view.reply_finished, timeout=120_000):
        view.send("Tell me a story about a fox.")
        assert controller.poll_interval_ms == 200  # at once, before the engine has the request
    assert controller.last_status.get("polled_at") != polled_at  # polled again meanwhile
    assert controller.poll_interval_ms == 200  # its decode rate is still fresh
    qtbot.waitUntil(lambda: controller.poll_interval_ms == 200 * IDLE_POLL_FACTOR, timeout=30_000)
