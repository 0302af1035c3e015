"""Choosing a model (issue 16 item 6), against a real engine process: an imported model is in the chat's
picker at once (no restart) under one name, the picker is wide enough to read, and the Installed tab's
Load button loads the model into the engine."""
from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import Qt

from store_helpers import write_tiny_gguf
from test_ui_tray import ember  # noqa: F401 - the app on its own engine
from ui_support import own_engine, tiny_gguf, ui_settings  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(300)


def picker_items(panel) -> dict[str | None, str]:
    return {panel.model.itemData(i): panel.model.itemText(i) for i in range(panel.model.count())}


def test_import_shows_in_the_picker_at_once_and_load_loads_it(qtbot, ember, tiny_model_factory, tmp_path):
    panel = ember.window.settings_panel
    ember.window.show()
    ember.window.new_chat()
    assert panel.model.itemText(0) == "The loaded model"
    manager = ember.open_model_manager()
    qtbot.addWidget(manager)
    table = manager.installed
    gguf = tiny_model_factory(seed=3)
    with qtbot.waitSignal(table.changed, timeout=60_000):
        table.import_file(gguf)
    new_id = table.selected_id()
    name = ember.store.get(new_id).name
    assert picker_items(panel).get(new_id) == name, "the imported model is not in the chat's picker"
    qtbot.waitUntil(lambda: new_id in ember.controller.models, timeout=10_000)  # and the engine lists it
    assert picker_items(panel)[new_id] == name  # one name, the same in the Installed tab
    assert table.table.item(table.table.currentRow(), 0).text().startswith(name)
    assert panel.model.width() >= 180, "the picker is too narrow to read a model's name"
    longest = max(panel.model.fontMetrics().horizontalAdvance(t) for t in picker_items(panel).values())
    assert panel.model.view().minimumWidth() >= longest, "the open list cuts names short"

    assert table.load_button.isEnabled()
    qtbot.mouseClick(table.load_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: ember.controller.last_status.get("model") == new_id, timeout=120_000)
    qtbot.waitUntil(lambda: name in ember.window.status.model_label.text(), timeout=10_000)


def test_two_models_of_one_name_are_told_apart(qtbot, ember, tmp_path):
    for i in (1, 2):
        ember.store.import_path(write_tiny_gguf(tmp_path / f"m{i}.gguf", name="Same Name", seed=i),
                                model_id=f"same-{i}")
    ember.window.refresh_model_picker()
    labels = [t for d, t in picker_items(ember.window.settings_panel).items() if d and d.startswith("same-")]
    # (tiny files with no chat template: base models, marked so)
    assert sorted(labels) == ["Same Name · text completion (same-1)", "Same Name · text completion (same-2)"]


def test_a_refresh_asked_while_one_is_in_flight_is_not_lost(qtbot, ember, tmp_path, monkeypatch):
    """The engine's answer in flight can predate an import; the refresh the import asks for must
    then follow it, not be dropped (a race CI once hit in the test above)."""
    qtbot.waitUntil(lambda: bool(ember.controller.models), timeout=30_000)
    client = ember.controller.client()
    answered, release = threading.Event(), threading.Event()
    real_models = type(client).models

    def stale_then_blocked(self):
        models = real_models(self)  # the answer is taken now, before the import
        if not answered.is_set():
            answered.set()
            release.wait(30)
        return models

    monkeypatch.setattr(type(client), "models", stale_then_blocked)
    ember.controller.refresh_models()
    assert answered.wait(30)
    ember.store.import_path(write_tiny_gguf(tmp_path / "late.gguf", name="Late", seed=7), model_id="late-model")
    ember.controller.refresh_models()  # while the stale answer is still in flight
    release.set()
    qtbot.waitUntil(lambda: "late-model" in ember.controller.models, timeout=30_000)
