"""The Settings dialog's rows for issue 63: the Ollama port's "without the key", and the models
kept loaded at once (memory, how many, how long an idle one stays); offscreen, saved through the
real Settings file."""
from __future__ import annotations

import json

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog

from ui.settings_dialog import SettingsDialog
from ui_support import ui_settings  # noqa: F401 - fixture


def test_the_ollama_ports_keyless_box_follows_the_port(qtbot, ui_settings):  # noqa: F811
    ui_settings.save()
    dialog = SettingsDialog(ui_settings)
    qtbot.addWidget(dialog)
    box = dialog.ollama_keyless
    assert ui_settings.ollama_port == 0 and not box.isEnabled() and not box.isChecked()  # no port: nothing to open
    dialog.ollama_port.setValue(11434)
    assert box.isEnabled() and "without the API key" in box.toolTip()
    qtbot.mouseClick(box, Qt.LeftButton)
    assert box.isChecked()
    dialog.accept()
    assert dialog.result() == QDialog.DialogCode.Accepted, dialog.error.text()
    saved = json.loads(ui_settings.path.read_text())
    assert saved["ollama_port"] == 11434 and saved["ollama_keyless"] is True
    again = SettingsDialog(ui_settings)  # reopened: as saved
    qtbot.addWidget(again)
    assert again.ollama_keyless.isChecked() and again.ollama_keyless.isEnabled()
    again.ollama_port.setValue(0)
    assert not again.ollama_keyless.isEnabled()


def test_the_residency_rows_save_and_refuse_a_bad_duration(qtbot, ui_settings):  # noqa: F811
    ui_settings.save()
    dialog = SettingsDialog(ui_settings)
    qtbot.addWidget(dialog)
    assert dialog.memory_budget.text() == "automatic (75% of memory)"  # 0, in the user's words
    assert dialog.max_loaded_models.value() == 3 and dialog.keep_alive.text() == "5m"
    assert "unloaded" in dialog.memory_budget.toolTip() and "-1" in dialog.keep_alive.toolTip()
    dialog.memory_budget.setValue(6.5)
    dialog.max_loaded_models.setValue(2)
    dialog.keep_alive.clear()
    qtbot.keyClicks(dialog.keep_alive, "tomorrow")
    dialog.accept()  # refused: the dialog stays open and says which field and why
    assert dialog.result() != QDialog.DialogCode.Accepted
    assert "keep_alive" in dialog.error.text() and "tomorrow" in dialog.error.text()
    assert "keep_alive" not in json.loads(ui_settings.path.read_text()) or ui_settings.keep_alive == "5m"
    dialog.keep_alive.clear()
    qtbot.keyClicks(dialog.keep_alive, "1h30m")
    dialog.accept()
    assert dialog.result() == QDialog.DialogCode.Accepted, dialog.error.text()
    saved = json.loads(ui_settings.path.read_text())
    assert (saved["memory_budget_gb"], saved["max_loaded_models"], saved["keep_alive"]) == (6.5, 2, "1h30m")


def test_fetching_image_urls_is_a_server_setting_the_engine_gets(qtbot, ui_settings):  # noqa: F811
    """Off by default; ticked, it is saved and the supervisor's engine command carries --fetch-image-urls,
    which the engine's own parser reads back."""
    from app.gui_main import ENGINE_FIELDS
    from app.settings import Settings
    from app.supervisor import EngineSupervisor
    from engine.serve import build_parser as engine_parser

    ui_settings.save()
    dialog = SettingsDialog(ui_settings)
    qtbot.addWidget(dialog)
    box = dialog.fetch_image_urls
    assert not box.isChecked() and "requests to the URLs clients send" in box.toolTip()
    assert box.parentWidget().title() == "Local server"  # with the other server settings
    assert "--fetch-image-urls" not in EngineSupervisor(ui_settings, model_id="m")._command(port=0)
    qtbot.mouseClick(box, Qt.LeftButton)
    dialog.accept()
    assert dialog.result() == QDialog.DialogCode.Accepted, dialog.error.text()
    assert json.loads(ui_settings.path.read_text())["fetch_image_urls"] is True
    reloaded = Settings.load(ui_settings.path, env={})
    cmd = EngineSupervisor(reloaded, model_id="m")._command(port=0)
    assert engine_parser().parse_args(cmd[cmd.index("serve"):]).fetch_image_urls is True
    assert "fetch_image_urls" in ENGINE_FIELDS  # saving it says the engine's restart applies it
    again = SettingsDialog(reloaded)
    qtbot.addWidget(again)
    assert again.fetch_image_urls.isChecked()
