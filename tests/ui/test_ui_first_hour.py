"""What a new user meets in the first hour (issue 16), on real widgets offscreen and a real engine:
the chat sends what its panel shows, the keyboard stays in the message box, the window stays narrow
and remembers its size, the shortcuts, the words of the status bar, the engine log and the version."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QLabel

from app.client import EngineClient
from app.gui_main import build_app
from app.settings import Settings
from app.supervisor import SupervisorState
from app.version import ember_version
from server_util import long_max_tokens
from store_helpers import write_tiny_gguf
from ui.status_bar import busy_text
from ui_support import make_settings, replies_ignore_eos, shared_engine, tiny_gguf  # noqa: F401

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def ember(qtbot, tmp_path, shared_engine):  # noqa: F811
    settings = make_settings(tmp_path / "app", close_to_tray=False)
    app = build_app(settings, supervisor=shared_engine, poll_interval_ms=200)
    qtbot.addWidget(app.window)
    app.window.show()
    app.window.activateWindow()
    app.controller.start()
    qtbot.waitUntil(lambda: app.controller.state == SupervisorState.READY, timeout=30_000)
    yield app
    for view in list(app.window._views.values()):
        view.stop()
    app.controller.close()
    app.chat_store.close()


def record_requests(monkeypatch) -> list[tuple[list[dict], dict]]:
    """Every chat request the app makes (messages, keywords), passed on to the real engine."""
    seen: list[tuple[list[dict], dict]] = []
    original = EngineClient.chat_stream

    def chat_stream(self, messages, *args, **kwargs):
        seen.append((list(messages), dict(kwargs)))
        return original(self, messages, *args, **kwargs)

    monkeypatch.setattr(EngineClient, "chat_stream", chat_stream)
    return seen


def test_an_untouched_new_chat_sends_exactly_what_the_panel_shows(qtbot, ember, monkeypatch):
    requests = record_requests(monkeypatch)
    view = ember.window.new_chat()
    panel = ember.window.settings_panel
    shown = {"temperature": panel.temperature.value(), "top_p": panel.top_p.value(),
             "max_tokens": panel.max_tokens.value()}
    with qtbot.waitSignal(view.reply_finished, timeout=120_000):
        view.send("Hello")
    messages, sent = requests[-1]
    assert {k: sent.get(k) for k in shown} == shown
    assert [m["role"] for m in messages] == ["user"], "an empty system prompt box sends no system prompt"
    assert panel.system_prompt.toPlainText() == "" and "assistant" not in panel.system_prompt.placeholderText()

    panel.system_prompt.setPlainText("Answer in French.")  # what the user types is what goes out
    panel.max_tokens.setValue(7)
    replies_ignore_eos(monkeypatch)  # a sampled first token may be EOS, and an empty reply shows nothing stored
    with qtbot.waitSignal(view.reply_finished, timeout=120_000):
        view.send("Hi again")
    messages, sent = requests[-1]
    assert messages[0] == {"role": "system", "content": "Answer in French."}
    assert sent["max_tokens"] == 7 and sent["temperature"] == shown["temperature"]
    usage = ember.chat_store.messages(view.chat_id)[-1]
    assert usage.status == "done" and usage.finish_reason == "length" and len(usage.content) > 0


def test_the_panel_shows_and_the_chat_sends_the_models_recommended_sampling(qtbot, tmp_path):
    settings = make_settings(tmp_path / "app")
    app = build_app(settings)
    qtbot.addWidget(app.window)
    gguf = write_tiny_gguf(tmp_path / "tuned.gguf", floats={"general.sampling.temp": 0.3,
                                                            "general.sampling.top_p": 0.8})
    model_id = app.store.import_path(gguf, model_id="tuned").id
    view = app.window.new_chat()
    panel = app.window.settings_panel
    app.window.refresh_model_picker()
    panel.model.setCurrentIndex(panel.model.findData(model_id))  # the user picks the model for this chat
    assert (panel.temperature.value(), panel.top_p.value()) == (pytest.approx(0.3), pytest.approx(0.8))
    assert panel.source.isVisibleTo(panel) and "temperature" in panel.source.text()
    sent = view.effective_settings()
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"]) == (
        pytest.approx(0.3), pytest.approx(0.8), panel.max_tokens.value())
    panel.temperature.setValue(1.1)  # the user's own value wins over the model's
    assert view.effective_settings()["temperature"] == pytest.approx(1.1)
    app.chat_store.close()


def test_focus_stays_in_the_message_box_after_stop_and_regenerate(qtbot, ember, monkeypatch):
    replies_ignore_eos(monkeypatch)
    n = long_max_tokens(ember.controller.base_url, ember.controller.api_key)
    view = ember.window.new_chat()
    ember.chat_store.update_chat_settings(view.chat_id, {"max_tokens": n})
    qtbot.waitUntil(lambda: QApplication.focusWidget() is view.input, timeout=5000)
    qtbot.keyClicks(view.input, "Write a long essay.")
    qtbot.keyClick(view.input, Qt.Key_Return)
    qtbot.waitUntil(lambda: len(view.transcript.messages[-1].content) > 5, timeout=60_000)
    with qtbot.waitSignal(view.reply_finished, timeout=10_000):
        qtbot.mouseClick(view.stop_button, Qt.LeftButton)
    assert QApplication.focusWidget() is view.input
    with qtbot.waitSignal(view.reply_started, timeout=10_000):
        qtbot.mouseClick(view.regenerate_button, Qt.LeftButton)
    assert QApplication.focusWidget() is view.input
    with qtbot.waitSignal(view.reply_finished, timeout=10_000):
        qtbot.keyClick(view.input, Qt.Key_Escape)  # Escape stops the reply
    assert QApplication.focusWidget() is view.input
    qtbot.keyClicks(QApplication.focusWidget(), "next")  # the next words go to the message box
    assert view.input.toPlainText() == "next" and ember.window.chat_list.search.text() == ""
    assert ember.window.chat_list.current_chat_id() == view.chat_id


def test_shortcuts_follow_the_platform(qtbot, ember):
    w = ember.window
    keys = {a.text(): {s.toString() for s in a.shortcuts()} for a in w.findChildren(type(w.actions.stop))}
    assert "Ctrl+N" in keys["New chat"] and "Ctrl+R" in keys["Regenerate reply"]
    assert "Esc" in keys["Stop reply"] and "Ctrl+F" in keys["Search chats"]
    assert "Ctrl+M" in keys["Model manager…"] and "Ctrl+," in keys["Settings…"]
    view = w.new_chat()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is view.input, timeout=5000)
    qtbot.keyClick(view.input, Qt.Key_F, Qt.ControlModifier)
    assert QApplication.focusWidget() is w.chat_list.search
    before = len(ember.chat_store.list_chats())
    qtbot.keyClick(w.chat_list.search, Qt.Key_N, Qt.ControlModifier)
    assert len(ember.chat_store.list_chats()) == before + 1
    assert QApplication.focusWidget() is w.current_view().input


def test_window_is_narrow_does_not_widen_and_remembers_its_size(qtbot, tmp_path):
    settings = make_settings(tmp_path / "app", close_to_tray=False)
    settings.save(tmp_path / "settings.json")
    app = build_app(settings)
    w = app.window
    qtbot.addWidget(w)
    w.show()
    w.new_chat()
    assert w.minimumSizeHint().width() < 900
    width = w.width()
    w.status.model_label.setText("Model: " + "qwen2.5-coder-0.5b-instruct-q4_k_m " * 8)
    w.status.kv_label.setText("Chat memory 100% used · " * 6)
    qtbot.wait(50)
    assert w.width() == width and w.minimumSizeHint().width() < 900
    w.resize(760, 560)  # inside the offscreen screen (800x600): restoreGeometry keeps a window on screen
    qtbot.waitUntil(lambda: w.width() == 760)
    w.close()  # saves the size
    app.chat_store.close()

    again = build_app(Settings.load(tmp_path / "settings.json", env={}).model_copy(
        update={"data_dir": settings.data_dir}))
    qtbot.addWidget(again.window)
    again.window.show()
    assert (again.window.width(), again.window.height()) == (760, 560)
    again.chat_store.close()


def test_status_bar_words_and_a_stopped_engine_shows_no_old_figures(qtbot, tmp_path):
    app = build_app(make_settings(tmp_path / "app"))
    bar = app.window.status
    qtbot.addWidget(app.window)
    bar._on_status_changed({"status": "ready", "model": "smollm2", "backend": "torch", "device": "cpu",
                            "kv": {"blocks_used": 728, "blocks_total": 2912, "prefix_hit_rate": 0.79},
                            "num_running": 1, "generation_tok_s": 41.7})
    assert bar.kv_label.text() == "Chat memory 25% used"
    assert "79%" in bar.kv_label.toolTip() and "KV" in bar.kv_label.toolTip()
    assert not [w for w in bar.findChildren(QLabel) if "tok/s" in w.text()]  # the chat's own line has its speed
    # not "Ready" while replies run
    assert [busy_text({"num_running": 1}), busy_text({"num_running": 2, "num_waiting": 1}), busy_text({})] == \
        ["Writing a reply", "Writing 2 replies · 1 waiting", ""]
    bar._on_state_changed(SupervisorState.STOPPED)
    assert [bar.model_label.text(), bar.kv_label.text()] == ["", ""]
    assert not bar.chart.values
    menus = [a.text() for m in app.window.menuBar().actions() for a in m.menu().actions() if a.text()]
    assert "Start engine" in menus and not any("server" in t.lower() for t in menus)
    app.chat_store.close()


def test_engine_log_and_version_from_the_window(qtbot, ember):
    dialog = ember.window.show_engine_log()
    qtbot.addWidget(dialog)
    assert ember_version() in dialog.version_label.text() and ember_version() != "unknown"
    assert "Uvicorn running" in dialog.views["Engine"].toPlainText() or \
        "ready" in dialog.views["Engine"].toPlainText().lower()
    assert ember.window.actions.engine_log.text() == "Engine log…"


def test_dark_theme_reaches_tooltips_and_the_tray_balloon(qapp):
    """Qt draws the tray's notice balloon (where no notification service runs) and tooltips with
    QToolTip's own palette, which the application palette does not change: pale text on pale yellow."""
    from PySide6.QtGui import QPalette
    from PySide6.QtWidgets import QToolTip

    from ui.resources import apply_theme

    before_app, before_tip, before_sheet = qapp.palette(), QToolTip.palette(), qapp.styleSheet()
    try:
        apply_theme(qapp, "dark")
        tip = QToolTip.palette()
        for back, text in ((QPalette.Window, QPalette.WindowText), (QPalette.ToolTipBase, QPalette.ToolTipText)):
            assert tip.color(back).lightness() < 90 and tip.color(text).lightness() > 180, (back, text)
    finally:
        qapp.setPalette(before_app)
        QToolTip.setPalette(before_tip)
        qapp.setStyleSheet(before_sheet)
