"""Python threads hand their results to the GUI thread without entering Qt themselves (ui/gui_thread.py).

A thread that emits a Qt signal takes Qt's signal-slot lock and, inside it, PySide takes the GIL; with
the GUI thread holding the GIL while it waits for that lock (Shiboken deleting a QObject collected on
another thread), the window froze, as a download test once did under gdb. The hang itself is a race
too rare to provoke on demand, so these tests check its precondition: no PySide call is made on a
worker or download thread (a profile hook sees every C call there), and everything still arrives,
in order, on the GUI thread. Real workers, a real DownloadManager, the real Qt event loop (offscreen).
"""
from __future__ import annotations

import threading

import pytest
from shiboken6 import Shiboken

from app.catalog import CatalogEntry
from app.downloads import DownloadManager
from app.store import ModelStore
from ui.download_bridge import DownloadBridge
from ui.gui_thread import gui_calls
from ui.workers import FunctionWorker, GeneratorWorker

pytestmark = pytest.mark.timeout(120)


def _is_pyside(owner: object) -> bool:
    if isinstance(owner, type):
        return issubclass(owner, Shiboken.Object) or owner.__module__.startswith(("PySide6", "shiboken6"))
    return isinstance(owner, Shiboken.Object) or type(owner).__module__.startswith(("PySide6", "shiboken6"))


@pytest.fixture
def qt_calls_off_gui_thread():
    """Names of the PySide functions called on threads started during the test, other than the GUI's."""
    calls: list[str] = []
    gui = threading.main_thread()

    def profile(frame, event, arg):
        if event == "c_call" and threading.current_thread() is not gui and _is_pyside(getattr(arg, "__self__", None)):
            calls.append(f"{threading.current_thread().name}: {arg.__qualname__}")

    threading.setprofile(profile)
    yield calls
    threading.setprofile(None)


def test_a_generator_workers_signals_arrive_in_order_on_the_gui_thread(qtbot, qt_calls_off_gui_thread):
    got: list[tuple[str, object, bool]] = []
    on_gui = lambda: threading.current_thread() is threading.main_thread()  # noqa: E731

    def count():
        for i in range(200):
            yield i
        return "done"

    worker = GeneratorWorker(count)
    worker.started.connect(lambda: got.append(("started", None, on_gui())))
    worker.yielded.connect(lambda i: got.append(("yielded", i, on_gui())))
    worker.returned.connect(lambda r: got.append(("returned", r, on_gui())))
    with qtbot.waitSignal(worker.finished, timeout=30_000):
        worker.start()
    assert [g[:2] for g in got] == [("started", None)] + [("yielded", i) for i in range(200)] + [("returned", "done")]
    assert all(g[2] for g in got), "a slot ran off the GUI thread"
    assert qt_calls_off_gui_thread == []


def test_a_failing_function_worker_reports_on_the_gui_thread(qtbot, qt_calls_off_gui_thread):
    def fail():
        raise ValueError("no such model")

    worker = FunctionWorker(fail)
    errors: list[Exception] = []
    worker.errored.connect(errors.append)
    worker.returned.connect(lambda r: pytest.fail("a failed work returned"))
    with qtbot.waitSignal(worker.finished, timeout=30_000):
        worker.start()
    assert [str(e) for e in errors] == ["no such model"] and worker.is_finished
    assert qt_calls_off_gui_thread == []


def test_download_events_reach_the_gui_thread_without_the_download_thread_entering_qt(
        qtbot, tmp_path, qt_calls_off_gui_thread):
    entry = CatalogEntry.from_dict({  # .invalid never resolves (RFC 6761): the download fails at once
        "id": "offline-q8_0", "name": "Offline Test", "family": "tiny", "parameters": "1M",
        "architecture": "llama", "quantization": "Q8_0", "format": "gguf", "repo": "ember-test/tiny",
        "license": "MIT", "files": [{"name": "offline.Q8_0.gguf", "size_bytes": 1234, "sha256": "0" * 64}],
    }, hub_base_url="http://hub.ember-test.invalid")
    downloads = DownloadManager(ModelStore(tmp_path / "models"), tmp_path / "dl", "http://hub.ember-test.invalid")
    bridge = DownloadBridge(downloads)
    seen: list[tuple[str, bool]] = []
    bridge.event.connect(lambda e: seen.append((e.state, threading.current_thread() is threading.main_thread())))
    downloads.start(entry)
    qtbot.waitUntil(lambda: any(state == "failed" for state, _ in seen), timeout=30_000)
    bridge.close()
    assert all(on_gui for _, on_gui in seen)
    assert qt_calls_off_gui_thread == []


def test_posts_from_many_threads_keep_each_threads_order(qtbot):
    calls = gui_calls()
    got: dict[int, list[int]] = {t: [] for t in range(4)}
    threads = [threading.Thread(target=lambda t=t: [calls.post(got[t].append, i) for i in range(2000)])
               for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    qtbot.waitUntil(lambda: all(len(v) == 2000 for v in got.values()), timeout=30_000)
    assert all(v == list(range(2000)) for v in got.values())
    now: list[int] = []
    calls.call(now.append, 1)  # on the GUI thread: at once, like an AutoConnection
    assert now == [1]
