"""The Settings dialog's rows for issue 63: the Ollama port's "without the key", offscreen, saved
through the real Settings file."""
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
