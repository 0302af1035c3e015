"""A model's own load settings (context, device, threads) from the model manager, used by every
load of it, and Settings' Memory group showing what the engine reports for the loaded model,
through the real widgets and a real engine process (issue 62, items 4 and 10)."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.gui_main import build_app
from app.store import LoadSettings, ModelStore
from app.supervisor import EngineSupervisor, SupervisorState
from engine.model_files.footprint import footprint_of, kv_itemsize
from engine.model_files.meta import read_meta
from ui.installed_table import COLUMNS
from ui.load_settings_dialog import LoadSettingsDialog
from ui_support import ENGINE_READY_TIMEOUT_S, LONG_KV, ui_settings  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(300)
OWN_CTX = 8192  # the tiny model's own context: the engine's default runs 4,096 of it


def context_item(installed, model_id: str):
    return installed.table.item(installed.model_ids().index(model_id), COLUMNS.index("Context"))


def context_cell(installed, model_id: str) -> str:
    return context_item(installed, model_id).text()


def test_the_dialog_edits_a_models_load_settings(qtbot, ui_settings, tiny_model_factory):  # noqa: F811
    store = ModelStore(ui_settings.models_dir)
    m = store.import_path(tiny_model_factory(ctx=OWN_CTX), model_id="tiny", mode="link")
    dialog = LoadSettingsDialog(m, LoadSettings(), ui_settings)
    qtbot.addWidget(dialog)
    assert dialog.context.text() == "the engine's default (4,096 tokens)"
    assert dialog.device.currentText() == f"as in Settings ({ui_settings.device})"
    assert dialog.threads.text() == "as in Settings (automatic)"
    assert dialog.value() == LoadSettings()  # nothing changed: nothing saved
    dialog.context.setValue(2048)
    dialog.device.setCurrentIndex(dialog.device.findData("cpu"))
    dialog.threads.setValue(2)
    assert dialog.value() == LoadSettings(context_length=2048, device="cpu", threads=2)
    dialog.context.setValue(100_000)  # never past the model's own
    assert dialog.value().context_length == OWN_CTX
    again = LoadSettingsDialog(m, LoadSettings(context_length=1024, device="cpu", threads=3), ui_settings)
    qtbot.addWidget(again)
    assert (again.context.value(), again.device.currentData(), again.threads.value()) == (1024, "cpu", 3)


def test_every_load_of_a_model_uses_its_settings_and_settings_shows_the_engines_figures(
        qtbot, ui_settings, tiny_model_factory):  # noqa: F811
    path = tiny_model_factory(ctx=OWN_CTX)
    ModelStore(ui_settings.models_dir).import_path(path, model_id="tiny", mode="link")
    ui_settings.default_model = "tiny"
    sup = EngineSupervisor(ui_settings, model_id="tiny", port=0, extra_args=LONG_KV)
    app = build_app(ui_settings, supervisor=sup, poll_interval_ms=200)
    try:
        qtbot.addWidget(app.window)
        installed = app.open_model_manager().installed
        assert context_cell(installed, "tiny") == f"4,096 of {OWN_CTX:,}"  # what the engine will run
        assert installed.set_load_settings("tiny", LoadSettings(context_length=512, threads=1))
        assert context_cell(installed, "tiny") == f"512 of {OWN_CTX:,}"
        assert "as set in Load settings" in context_item(installed, "tiny").toolTip()

        app.controller.start()  # the engine starts with the model's settings
        qtbot.waitUntil(lambda: app.controller.last_status.get("model") == "tiny"
                        and app.controller.last_status.get("status") == "ready",
                        timeout=int(ENGINE_READY_TIMEOUT_S * 1000))
        status = app.controller.last_status
        assert (status["max_model_len"], status["threads"]) == (512, 1)
        kv, dtype = status["kv"], status["decision"]["dtype"]
        per_token = footprint_of(read_meta(path), path.stat().st_size).kv_bytes_per_token(kv_itemsize("torch", dtype))
        assert kv["bytes_reserved"] == kv["blocks_total"] * kv["block_size"] * per_token
        assert 0 < status["weight_bytes"] < 4 * path.stat().st_size

        dialog = app.open_settings()  # Memory: the loaded model's own figures, then the calculator
        words = dialog.memory.loaded.text()
        name = ModelStore(ui_settings.models_dir).get("tiny").name
        assert words.startswith(f"{name} runs on {status['backend']} ({status['device']}")
        assert "weights " in words and f"{kv['blocks_total']:,} blocks of {kv['block_size']} tokens" in words
        assert "context 512 tokens" in words and "1 thread." in words
        assert dialog.memory.context.value() == 512  # the calculator starts at the context it runs
        assert "What if…" in dialog.memory.what_if.text() and "not a setting" in dialog.memory.what_if.text()
        dialog.reject()

        assert installed.set_load_settings("tiny", LoadSettings(context_length=1024))
        assert "Load it again" in installed.message.text()
        with qtbot.waitSignal(app.controller.load_finished, timeout=120_000) as loaded:
            installed.select("tiny")
            qtbot.mouseClick(installed.load_button, Qt.LeftButton)  # Load reads them again
        assert loaded.args == ["tiny", ""]
        qtbot.waitUntil(lambda: app.controller.last_status.get("max_model_len") == 1024, timeout=30_000)
        qtbot.waitUntil(lambda: context_cell(installed, "tiny") == f"1,024 of {OWN_CTX:,}", timeout=10_000)
    finally:
        app.controller.close()
        app.chat_store.close()
        sup.stop()


def test_a_model_without_its_own_threads_does_not_keep_the_last_ones():
    """torch's threads are the process's: a load with none set gives back what they were."""
    import torch

    from engine.model_runner import use_threads

    before = torch.get_num_threads()
    try:
        use_threads(before + 1)
        use_threads(before + 2)
        assert torch.get_num_threads() == before + 2
        use_threads(None)
        assert torch.get_num_threads() == before
        use_threads(None)  # nothing set: left alone
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)
