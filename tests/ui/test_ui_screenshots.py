"""Screenshots for reviewers, rendered offscreen into artifacts/screenshots/ (gitignored).

The main window shows a reply streamed from the real bundled model (SmolLM2-135M-Instruct);
run `pytest tests/ui/test_ui_screenshots.py` and open the PNGs.
"""
from __future__ import annotations

import pytest
from PySide6.QtWidgets import QApplication

from app.gui_main import build_app
from ui.resources import apply_theme
from ui_support import SCREENSHOT_DIR, make_settings, start_engine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(params=["light", "dark"])
def theme(request, qapp):
    apply_theme(qapp, request.param)
    yield request.param
    apply_theme(qapp, "system")


@pytest.fixture(scope="module")
def bundled_engine(tmp_path_factory, bundled_model_path):
    settings = make_settings(tmp_path_factory.mktemp("shots"))
    sup = start_engine(settings, bundled_model_path)
    yield sup
    sup.stop()


def save(widget, name: str) -> None:
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    QApplication.processEvents()
    path = SCREENSHOT_DIR / name
    assert widget.grab().save(str(path)), f"could not write {path}"
    assert path.stat().st_size > 5000


def test_screenshots(qtbot, tmp_path, bundled_engine, theme):
    settings = make_settings(tmp_path / "app", theme=theme)
    app = build_app(settings, supervisor=bundled_engine, poll_interval_ms=250)
    qtbot.addWidget(app.window)
    app.window.resize(1200, 760)
    app.window.show()
    app.controller.start()
    try:
        older = app.window.new_chat()
        app.chat_store.rename_chat(older.chat_id, "Trip ideas for the weekend")
        view = app.window.new_chat()
        app.chat_store.update_chat_settings(view.chat_id, {"temperature": 0.0, "max_tokens": 160,
                                                           "system_prompt": "You are a concise coding assistant."})
        app.window.open_chat(view.chat_id)
        with qtbot.waitSignal(view.reply_finished, timeout=300_000) as done:
            view.send("Write a Python function that checks whether a number is prime.")
        assert done.args[1] == "done"
        assert view.transcript.messages[-1].content.strip()
        qtbot.waitUntil(lambda: "Chat memory" in app.window.status.kv_label.text()
                        and app.controller.last_status.get("num_running") == 0, timeout=10_000)
        save(app.window, f"main-window-{theme}.png")

        manager = app.open_model_manager(app.window)
        manager.resize(960, 480)
        save(manager, f"model-manager-{theme}.png")
        manager.tabs.setCurrentWidget(manager.installed)
        save(manager, f"model-manager-installed-{theme}.png")
        manager.close()

        dialog = app.open_settings(app.window)
        save(dialog, f"settings-{theme}.png")
        dialog.reject()
    finally:
        for v in app.window._views.values():
            v.stop()
        app.controller.close()
        app.chat_store.close()
