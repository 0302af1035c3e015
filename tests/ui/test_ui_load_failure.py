"""Load in the model manager, on a model that cannot load: the manager and the status bar say
why in words, and the model that served before keeps answering (a real engine process).

The model that fails is a GGUF of an architecture no runner knows, put in the store by hand (as
an older Ember could have; today's import refuses it: tests/engine/test_model_families_load.py).
"""
from __future__ import annotations

import httpx
from PySide6.QtCore import Qt

from app.gui_main import build_app
from app.store import ModelStore
from app.supervisor import SupervisorState
from arch_ggufs import UNKNOWN_ARCH, write_arch_gguf
from engine.model_files.manifest import ModelManifest, write_manifest
from engine.model_files.meta import read_meta
from server_util import LONG_CTX
from ui_support import LONG_KV, start_engine, ui_settings  # noqa: F401 - fixtures

LOAD_TIMEOUT_MS = 120_000


def click_load(qtbot, installed, model_id: str) -> None:
    installed.select(model_id)
    qtbot.mouseClick(installed.load_button, Qt.LeftButton)


def test_a_model_that_cannot_load_says_why_and_the_one_before_keeps_answering(qtbot, ui_settings,  # noqa: F811
                                                                               tiny_model_factory, tmp_path):
    good = tiny_model_factory(ctx=LONG_CTX)
    ModelStore(ui_settings.models_dir).import_path(good, model_id="good", mode="link")
    bad = tmp_path / "bad.gguf"
    write_arch_gguf(bad, UNKNOWN_ARCH)
    write_manifest(ui_settings.models_dir, ModelManifest.from_meta(
        "bad", bad.resolve(), read_meta(bad), sha256="0" * 64, size_bytes=bad.stat().st_size, source="import"))
    sup = start_engine(ui_settings, good, extra_args=LONG_KV)
    app = build_app(ui_settings, supervisor=sup, poll_interval_ms=200)
    try:
        qtbot.addWidget(app.window)
        app.window.show()
        app.controller.start()
        qtbot.waitUntil(lambda: app.controller.state == SupervisorState.READY, timeout=30_000)
        installed = app.open_model_manager().installed

        with qtbot.waitSignal(app.controller.load_finished, timeout=LOAD_TIMEOUT_MS) as loaded:
            click_load(qtbot, installed, "good")
        assert loaded.args == ["good", ""] and installed.message.text() == "good is loaded and ready."

        with qtbot.waitSignal(app.controller.load_finished, timeout=LOAD_TIMEOUT_MS) as failed:
            click_load(qtbot, installed, "bad")
        words = installed.message.text()
        assert failed.args == ["bad", words]
        assert words.startswith(f"Could not load bad: unsupported architecture '{UNKNOWN_ARCH}': Ember runs ")
        assert words.endswith(("good and model are still loaded.", "model and good are still loaded."))  # both serve
        assert not any(speak in words for speak in ("/v1/", "POST", "Traceback", "{"))

        bar = app.window.status  # a poll after the failed load: ready on good, the failure in the tooltip
        qtbot.waitUntil(lambda: app.controller.last_status.get("model") == "good" and bar.state_label.text() == "Ready"
                        and "loading bad failed" in bar.state_label.toolTip(), timeout=30_000)
        body = {"model": "good", "prompt": "The fox", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
        r = httpx.post(sup.base_url + "/v1/completions", json=body, timeout=60,
                       headers={"Authorization": f"Bearer {sup.api_key}"})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    finally:
        app.controller.close()
        app.chat_store.close()
        sup.stop()
