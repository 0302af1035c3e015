"""Fast Qt tests without an engine: workers, input box, transcript, chat list, settings dialog, single instance."""
from __future__ import annotations

import json
import logging
import threading

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QDialog

from app.history import ChatStore
from ui.chat_list import ChatListPanel
from ui.crash_dialog import CrashReporter
from ui.message_input import MessageInput
from ui.settings_dialog import SettingsDialog
from ui.single_instance import SingleInstance, instance_key
from ui.transcript import TranscriptView
from ui.transcript_markdown import to_markdown
from ui.transcript_message import TranscriptMessage
from ui.workers import FunctionWorker, GeneratorWorker, create_worker
from ui_support import ui_settings  # noqa: F401 - fixture


def counter(n):
    for i in range(n):
        yield i
    return "done"


def test_generator_worker_signals_in_order(qtbot):
    worker = create_worker(counter, 3)
    assert isinstance(worker, GeneratorWorker)
    seen = []
    worker.yielded.connect(seen.append)
    signals = [worker.started, worker.yielded, worker.yielded, worker.yielded, worker.returned, worker.finished]
    with qtbot.waitSignals(signals, order="strict", timeout=5000):
        worker.start()
    assert seen == [0, 1, 2]


def test_worker_reports_errors_and_quit_stops_between_items(qtbot):
    def boom():
        raise ValueError("bad input")

    worker = FunctionWorker(boom)
    with qtbot.waitSignal(worker.errored, timeout=5000) as blocker:
        worker.start()
    assert isinstance(blocker.args[0], ValueError)

    closed = threading.Event()

    def endless():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()  # the generator is closed on the worker thread after quit()

    worker = GeneratorWorker(endless)
    returned, seen = [], []
    worker.returned.connect(returned.append)
    worker.yielded.connect(seen.append)
    worker.yielded.connect(worker.quit)  # quit as soon as the first item arrives
    with qtbot.waitSignal(worker.finished, timeout=5000):
        worker.start()
    assert closed.wait(2) and returned == []
    assert seen and seen == list(range(len(seen)))


def test_message_input_enter_sends_shift_enter_breaks_line(qtbot):
    box = MessageInput()
    qtbot.addWidget(box)
    qtbot.keyClicks(box, "first line")
    qtbot.keyClick(box, Qt.Key_Return, Qt.ShiftModifier)
    qtbot.keyClicks(box, "second")
    assert box.toPlainText() == "first line\nsecond"
    with qtbot.waitSignal(box.submitted, timeout=1000) as blocker:
        qtbot.keyClick(box, Qt.Key_Return)
    assert blocker.args == ["first line\nsecond"]


def test_transcript_renders_code_blocks_monospace(qtbot):
    view = TranscriptView()
    qtbot.addWidget(view)
    view.set_messages([TranscriptMessage("user", "Write **hello**"),
                       TranscriptMessage("assistant", "Here:\n\n```python\nprint('hi')\n```\n\nDone.")])
    text = view.toPlainText()
    assert "print('hi')" in text and "**" not in text  # Markdown was rendered, not shown raw
    cursor = view.document().find("print('hi')")
    assert not cursor.isNull()
    fmt = cursor.charFormat()
    assert fmt.fontFixedPitch() or QFont(fmt.font()).styleHint() == QFont.Monospace
    plain = view.document().find("Done.")
    assert not plain.charFormat().fontFixedPitch()


def test_transcript_closes_an_unfinished_code_fence():
    md = to_markdown([TranscriptMessage("assistant", "```py\nx = 1", "streaming")])
    assert md.count("```") == 2


def test_chat_list_new_rename_search_delete(qtbot, tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    panel = ChatListPanel(store)
    qtbot.addWidget(panel)
    a = panel.new_chat()
    store.add_message(a, "user", "tell me about foxes")
    b = panel.new_chat()
    panel.rename(b, "  Cooking   ideas ")
    assert store.get_chat(b).title == "Cooking ideas"
    assert panel.current_chat_id() == b
    panel.search.setText("foxes")
    assert [panel.list.item(i).data(Qt.UserRole) for i in range(panel.list.count())] == [a]
    panel.search.clear()
    with qtbot.waitSignal(panel.chat_deleted) as blocker:
        panel.delete(b)
    assert blocker.args == [b]
    assert [c.id for c in store.list_chats()] == [a]


@pytest.mark.parametrize("url, ok", [("not a url", False), ("http://127.0.0.1:9/v1", True)])
def test_settings_dialog_validates_and_saves(qtbot, ui_settings, url, ok):  # noqa: F811
    ui_settings.save()
    dialog = SettingsDialog(ui_settings)
    qtbot.addWidget(dialog)
    dialog.server_port.setValue(9123)
    assert dialog.ollama_port.text() == "off"  # 0, in the user's words
    dialog.ollama_port.setValue(11434)
    assert dialog.kv_fraction.text() == "25% of free memory"  # the user's words, not 0.25
    dialog.kv_fraction.setValue(40)
    dialog.theme.setCurrentText("dark")
    dialog.connection_url.clear()
    qtbot.keyClicks(dialog.connection_url, url)
    dialog.accept()
    saved = json.loads(ui_settings.path.read_text())
    if ok:
        assert dialog.result() == QDialog.DialogCode.Accepted and dialog.error.text() == ""
        assert saved["server_port"] == 9123 and saved["theme"] == "dark" and saved["kv_memory_fraction"] == 0.4
        assert saved["ollama_port"] == 11434
        assert saved["connection_url"] == "http://127.0.0.1:9/v1"
    else:
        assert dialog.result() != QDialog.DialogCode.Accepted and "connection_url" in dialog.error.text()
        assert saved.get("server_port") == 0 and ui_settings.server_port == 0  # nothing half-applied


def test_second_instance_raises_the_first(qtbot, tmp_path):
    key = instance_key(str(tmp_path))
    first = SingleInstance(key)
    assert first.acquire()
    try:
        with qtbot.waitSignal(first.activated, timeout=3000):
            assert not SingleInstance(key).acquire()
    finally:
        first.release()


def test_crash_reporter_logs_and_shows_a_dialog(qtbot, caplog, tmp_path):
    reporter = CrashReporter(tmp_path / "ember.log")
    try:
        raise RuntimeError("kaboom")
    except RuntimeError as e:
        with caplog.at_level(logging.CRITICAL, logger="ember"):
            reporter(type(e), e, e.__traceback__)
    assert "uncaught error" in caplog.text and "kaboom" in caplog.text
    assert len(reporter.dialogs) == 1 and reporter.dialogs[0].isVisible()
    assert "kaboom" in reporter.dialogs[0].text()
    reporter.dialogs[0].close()



def test_signal_emit_does_not_leak_a_reference_to_true():
    """PySide6 6.12.0 on CPython 3.11 returns True from emit() without a reference: after a few
    thousand emits (a few long replies) True is freed and the process aborts. pyproject excludes it."""
    import sys

    from PySide6.QtCore import QObject, Signal

    class Source(QObject):
        fired = Signal()

    source = Source()
    before = sys.getrefcount(True)
    for _ in range(1000):
        source.fired.emit()
    assert sys.getrefcount(True) >= before - 10


def test_chats_persist_across_restarts_and_export(qtbot, tmp_path, ui_settings):  # noqa: F811
    from ui.engine_controller import EngineController
    from ui.main_window import MainWindow

    db = tmp_path / "chats.sqlite3"
    store = ChatStore(db)
    window = MainWindow(ui_settings, store, EngineController(ui_settings, None))
    qtbot.addWidget(window)
    view = window.new_chat()
    store.rename_chat(view.chat_id, "Primes")
    store.add_message(view.chat_id, "user", "Is 7 prime?")
    store.add_message(view.chat_id, "assistant", "Yes:\n\n```python\nis_prime(7)\n```")
    window.export_chat(view.chat_id, tmp_path / "c.md", "md")
    window.export_chat(view.chat_id, tmp_path / "c.json", "json")
    assert "## Assistant" in (tmp_path / "c.md").read_text() and "is_prime(7)" in (tmp_path / "c.md").read_text()
    assert json.loads((tmp_path / "c.json").read_text())["messages"][0]["content"] == "Is 7 prime?"
    store.close()
    window.close()

    reopened = ChatStore(db)  # a new process: same file
    window2 = MainWindow(ui_settings, reopened, EngineController(ui_settings, None))
    qtbot.addWidget(window2)
    shown = window2.current_view()
    assert shown is not None and shown.chat_id == view.chat_id
    assert "Is 7 prime?" in shown.transcript.toPlainText() and "is_prime(7)" in shown.transcript.toPlainText()
    reopened.close()
