"""The tray icon's menu and actions against a real engine process; closing the window to the tray."""
from __future__ import annotations

import pytest
from PySide6.QtGui import QGuiApplication

from app.gui_main import build_app
from ui_support import own_engine, tiny_gguf, ui_settings  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def ember(qtbot, own_engine):  # noqa: F811
    app = build_app(own_engine.settings, supervisor=own_engine, poll_interval_ms=200)
    qtbot.addWidget(app.window)
    app.controller.start()
    qtbot.waitUntil(lambda: app.controller.last_status.get("status") == "ready", timeout=30_000)
    yield app
    app.controller.close()
    app.chat_store.close()


def open_menu(tray) -> list[str]:
    tray.menu.aboutToShow.emit()  # what Qt emits when the user opens it
    return tray.action_texts()


def test_tray_menu_reflects_state_and_its_actions_work(qtbot, ember, own_engine):  # noqa: F811
    tray, controller = ember.tray, ember.controller
    texts = open_menu(tray)
    assert texts[0] == "Open Ember" and texts[-1] == "Quit Ember"
    assert f"Server: {own_engine.base_url}" in texts
    assert "Stop engine" in texts and "Copy API key" in texts
    assert any(t.startswith("Model: ") and t != "Model: none loaded" for t in texts)
    assert "serving" in tray.toolTip()

    tray.copy_key_action.trigger()
    assert QGuiApplication.clipboard().text() == own_engine.api_key
    tray.copy_address_action.trigger()
    assert QGuiApplication.clipboard().text() == own_engine.base_url

    ember.window.hide()
    tray.open_action.trigger()
    qtbot.waitUntil(ember.window.isVisible, timeout=2000)

    tray.server_action.trigger()  # Stop engine
    qtbot.waitUntil(lambda: controller.state == "stopped", timeout=30_000)
    texts = open_menu(tray)
    assert "Start engine" in texts and "Server: not running" in texts
    assert "stopped" in tray.toolTip()
    assert own_engine.pid is None

    tray.server_action.trigger()  # Start engine
    qtbot.waitUntil(lambda: controller.state == "ready", timeout=120_000)
    assert f"Server: {own_engine.base_url}" in open_menu(tray)

    with qtbot.waitSignal(controller.quit_requested, timeout=1000):
        tray.quit_action.trigger()


def test_closing_the_window_keeps_serving_from_the_tray(qtbot, ember, own_engine, monkeypatch):  # noqa: F811
    shown = []
    ember.tray.show()
    # record the balloon (the offscreen platform has no tray area to draw it in)
    monkeypatch.setattr(type(ember.tray), "showMessage", lambda self, *a: shown.append(a[:2]))
    ember.window.show()
    quits = []
    ember.controller.quit_requested.connect(lambda: quits.append(True))
    ember.window.close()
    assert not ember.window.isVisible() and not quits
    assert own_engine.state == "ready"
    assert shown and "still running" in shown[0][0]
    assert ember.settings.tray_notice_shown
    ember.window.show()
    ember.window.close()
    assert len(shown) == 1, "the notice is shown only the first time"
