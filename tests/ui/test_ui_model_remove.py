"""The model manager's Delete removes what `ember models rm` removes, through the one function both
call (app/model_remove.py): the model's blocks in the prefix cache's disk tier at once, the model,
and a vision model's projector; a linked file stays and the message says where. Offscreen, the real
store and tier, the real confirmation box answered with its Yes button."""
from __future__ import annotations

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

from app.store import ModelStore
from engine.kv_disk.store import KVDiskStore
from ui.installed_table import InstalledTable
from ui_support import ui_settings  # noqa: F401 - fixture
from vlm_factory import write_tiny_vlm


def _blocks(root, label, salt: bytes) -> None:
    store = KVDiskStore(root, salt, 2**30, label=str(label))
    for h in range(3):
        store.put(h, bytes(1000))
    store.close()


def _delete_clicked(qtbot, table: InstalledTable, model_id: str) -> None:
    table.select(model_id)

    def answer_yes() -> None:
        box = QApplication.activeModalWidget()
        assert isinstance(box, QMessageBox) and model_id in box.text()
        box.button(QMessageBox.Yes).click()

    QTimer.singleShot(0, answer_yes)
    with qtbot.waitSignal(table.changed, timeout=10_000):
        qtbot.mouseClick(table.delete_button, Qt.LeftButton)


def test_delete_removes_the_blocks_the_model_and_its_projector(qtbot, ui_settings, tmp_path):  # noqa: F811
    vlm, outside = write_tiny_vlm(tmp_path / "vlm"), write_tiny_vlm(tmp_path / "outside", seed=5)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF")
    store = ModelStore(ui_settings.models_dir)
    eye = store.import_path(vlm.model, model_id="eye", mmproj=vlm.mmproj)  # copied into the store
    store.import_path(outside.model, model_id="linked", mode="link", mmproj=outside.mmproj)
    root = ui_settings.kv_cache_dir
    salts = {"eye": b"0123456789abcdef", "linked": b"fedcba9876543210", "other": b"00112233445566ff"}
    _blocks(root, eye.path, salts["eye"])
    _blocks(root, outside.model.resolve(), salts["linked"])
    _blocks(root, other.resolve(), salts["other"])
    table = InstalledTable(store, ui_settings)
    qtbot.addWidget(table)
    table.show()
    assert sorted(table.model_ids()) == ["eye", "linked"]

    _delete_clicked(qtbot, table, "eye")
    assert store.get("eye") is None and table.model_ids() == ["linked"]
    assert not (ui_settings.models_dir / "eye").exists()  # the model and its projector with it
    assert not (root / salts["eye"].hex()).exists()  # its blocks, at once
    assert table.message.text() == "Deleted eye."

    _delete_clicked(qtbot, table, "linked")
    assert table.model_ids() == [] and outside.model.is_file() and outside.mmproj.is_file()  # linked: left in place
    assert "left in place" in table.message.text() and str(outside.mmproj.resolve()) in table.message.text()
    assert not (root / salts["linked"].hex()).exists()
    assert len(list((root / salts["other"].hex()).glob("*.kv"))) == 3  # another model's blocks stay
