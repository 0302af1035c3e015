"""Helpers for the GUI tests: real engine processes, settings in a tmp dir, event-loop gap meters.

Import the fixtures into a test module with `from ui_support import ...`.
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, QTimer

from app.settings import Settings
from app.supervisor import EngineSupervisor
from server_util import LONG_CTX

ENGINE_READY_TIMEOUT_S = 180.0
SCREENSHOT_DIR = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"


# The torch backend by default: llama.cpp's runner cannot yet size its context for the tiny
# models (it asks for millions of cells); EMBER_TEST_BACKEND=auto tries the shipped default.
TEST_BACKEND = os.environ.get("EMBER_TEST_BACKEND", "torch")
# The engines that reply serve a tiny model with a long context (server_util.long_max_tokens), in a
# small fixed KV pool: two such replies fit (sizing the pool from free RAM would take 128 MiB).
LONG_KV = ("--num-kv-blocks", "512")


def make_settings(root: Path, **overrides) -> Settings:
    """Settings rooted in `root` (no file, no env), with a free port so tests never collide."""
    s = Settings(data_dir=root / "data", server_port=0, **{"backend": TEST_BACKEND, **overrides})
    s.ensure_dirs()
    return s


def start_engine(settings: Settings, model_path: Path, **kwargs) -> EngineSupervisor:
    """A supervised engine (the GUI's own kind), ready; its failure quotes the engine's log."""
    sup = EngineSupervisor(settings, model_path=model_path, port=0, **kwargs)
    sup.start()
    if not sup.wait_ready(ENGINE_READY_TIMEOUT_S):
        tail = sup.log_tail()
        sup.stop()
        pytest.fail(f"engine did not become ready ({sup.state}: {sup.message}){tail}")
    return sup


@pytest.fixture
def ui_settings(tmp_path) -> Settings:
    return make_settings(tmp_path / "ember")


@pytest.fixture
def tiny_gguf(tiny_model_factory) -> Path:
    return tiny_model_factory()


@pytest.fixture(scope="module")
def shared_engine(tmp_path_factory, tiny_model_factory):
    """One engine process on the tiny model for the tests of a module that do not kill it."""
    settings = make_settings(tmp_path_factory.mktemp("shared-engine"))
    sup = start_engine(settings, tiny_model_factory(ctx=LONG_CTX), extra_args=LONG_KV)
    yield sup
    sup.stop()


@contextmanager
def app_on(qtbot, settings: Settings, supervisor: EngineSupervisor):
    """The whole app (window, tray, controller) on an engine it does not own, which outlives it."""
    from app.gui_main import build_app

    app = build_app(settings, supervisor=supervisor, poll_interval_ms=200)
    qtbot.addWidget(app.window)
    app.window.show()
    app.controller.start()
    try:
        yield app
    finally:
        for view in list(app.window._views.values()):
            view.stop()
        app.controller.close()
        app.chat_store.close()


@pytest.fixture
def ember(qtbot, tmp_path, shared_engine):
    """The whole app on the module's shared engine."""
    with app_on(qtbot, make_settings(tmp_path / "app"), shared_engine) as app:
        yield app


@pytest.fixture
def own_engine(ui_settings, tiny_model_factory):
    """An engine process for one test (which may kill or stop it)."""
    sup = start_engine(ui_settings, tiny_model_factory(ctx=LONG_CTX), backoff=(0.2, 1.0), extra_args=LONG_KV)
    yield sup
    sup.stop()


def allowed_gap_ms(base_ms: float = 200.0) -> float:
    """`base_ms` on a quiet machine; scaled by the run queue when the cores are oversubscribed.

    On the shared 2-core test machines the load average can reach 10+: the OS then parks a
    runnable GUI thread for hundreds of ms although nothing blocks it. Blocking designs (a model
    load or a reply on the GUI thread) stall it for seconds, so they still fail the check.
    """
    per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return base_ms * max(1.0, per_core)


def replies_ignore_eos(monkeypatch) -> None:
    """Every reply the app asks for runs to its max_tokens: the tiny model's EOS cannot end it early
    (the chat settings have no ignore_eos; a test that needs a reply still running needs it)."""
    from app.client import EngineClient

    original = EngineClient.chat_stream

    def chat_stream(self, messages, *args, **kwargs):
        return original(self, messages, *args, **{"ignore_eos": True, **kwargs})

    monkeypatch.setattr(EngineClient, "chat_stream", chat_stream)


def record_client_threads(monkeypatch) -> list[str]:
    """Every EngineClient HTTP call, by thread name: none may run on the GUI thread."""
    from app.client import EngineClient

    seen: list[str] = []
    main = threading.main_thread()
    for name in ("_request", "chat_stream", "health"):
        original = getattr(EngineClient, name)

        def wrapped(self, *args, _original=original, **kwargs):
            seen.append("gui" if threading.current_thread() is main else "worker")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(EngineClient, name, wrapped)
    return seen


class GapMeter(QObject):
    """A QTimer ticking every `interval_ms` on the GUI thread; `max_gap_ms` is the longest wait seen.

    If anything blocks the GUI thread, the timer cannot fire and the gap grows.
    """

    def __init__(self, interval_ms: int = 20) -> None:
        super().__init__()
        self.ticks: list[float] = []
        self.timer = QTimer(self)
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self._on_tick)

    def start(self) -> None:
        self.ticks = [time.perf_counter()]
        self.timer.start()

    def stop(self) -> None:
        self.timer.stop()

    def _on_tick(self) -> None:
        self.ticks.append(time.perf_counter())

    @property
    def max_gap_ms(self) -> float:
        gaps = [b - a for a, b in zip(self.ticks, self.ticks[1:])]
        return 1000 * max(gaps) if gaps else float("inf")
