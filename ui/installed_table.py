"""Installed models: load and unload (the engine holds several at once), verify (hash in a worker),
delete, set as default, import a file."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QHeaderView, QLabel, QMessageBox, QPushButton,
                               QTableWidget, QVBoxLayout, QWidget)

from app.model_remove import remove_model
from app.settings import Settings
from app.store import LoadSettings, ModelManifest, ModelStore
from ui.installed_rows import COLUMNS, fill_row
from ui.load_settings_dialog import LoadSettingsDialog
from ui.resident_models import resident
from ui.workers import FunctionWorker


class InstalledTable(QWidget):
    """Over app.store.ModelStore. `default_changed(id)` after Set as default; `changed()` after edits."""

    default_changed = Signal(str)
    changed = Signal()
    load_requested = Signal(str)  # Load: the engine loads this model now, beside the others (the app connects it)
    unload_requested = Signal(str)  # Unload: the engine lets this model go once its replies end

    def __init__(self, store: ModelStore, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.settings = settings
        self._worker: FunctionWorker | None = None  # one hashing job (verify or import) at a time
        self._status: dict[str, str] = {}
        self._resident: dict[str, dict] = {}  # the engine's loaded models by id (each with "state", maybe "context")
        self.table = QTableWidget(0, len(COLUMNS), self)
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.setSelectionBehavior(QTableWidget.SelectRows)
        self.table.setSelectionMode(QTableWidget.SingleSelection)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.Stretch)
        self.load_button = QPushButton("Load", self, objectName="sendButton")
        self.load_button.setToolTip("Load this model into the engine now, beside the models already loaded")
        self.unload_button = QPushButton("Unload", self)
        self.unload_button.setToolTip("Free this model's memory (once its replies end); a chat on it loads it again")
        self.verify_button = QPushButton("Verify", self)
        self.delete_button = QPushButton("Delete", self)
        self.default_button = QPushButton("Set as default", self)
        self.import_button = QPushButton("Import file…", self)
        self.template_button = QPushButton("Chat template…", self)
        self.template_button.setToolTip("Use a Jinja chat template file in place of the one in the model's file "
                                        "(templates in GGUF files are often wrong or missing)")
        self.reset_template_button = QPushButton("Use the file's template", self)
        self.reset_template_button.setToolTip("Go back to the chat template in the model's file")
        self.load_settings_button = QPushButton("Load settings…", self)
        self.load_settings_button.setToolTip("This model's context length, device and threads, for every load")
        self.message = QLabel(self, wordWrap=True)
        buttons = QHBoxLayout()
        for b in (self.load_button, self.unload_button, self.verify_button, self.delete_button, self.default_button,
                  self.template_button, self.reset_template_button, self.load_settings_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        buttons.addWidget(self.import_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addWidget(self.message)
        layout.addLayout(buttons)
        self.load_button.clicked.connect(self._on_load_clicked)
        self.unload_button.clicked.connect(self._on_unload_clicked)
        self.verify_button.clicked.connect(self._on_verify_clicked)
        self.delete_button.clicked.connect(self._on_delete_clicked)
        self.default_button.clicked.connect(self._on_default_clicked)
        self.import_button.clicked.connect(self._on_import_clicked)
        self.template_button.clicked.connect(self._on_template_clicked)
        self.load_settings_button.clicked.connect(self._on_load_settings_clicked)
        self.reset_template_button.clicked.connect(
            lambda: (model_id := self.selected_id()) is not None and self.set_chat_template(model_id, None))
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.refresh()

    def refresh(self) -> None:
        selected = self.selected_id()
        models = self.store.list()
        self.table.setRowCount(len(models))
        for row, m in enumerate(models):
            fill_row(self.table, row, m, self.store, self.settings, self._resident.get(m.id),
                     self._status.get(m.id, ""))
            if m.id == selected:
                self.table.selectRow(row)
        self._update_buttons()

    def show_status(self, status: dict) -> None:
        """Mark the models a polled /v1/engine/status lists as loaded, with the context each runs."""
        models = {m["id"]: {"id": m["id"], "state": m.get("state"), "bytes": m.get("bytes"),
                            "context": m.get("context_length")} for m in resident(status)}
        if status.get("model") in models and not models[status["model"]]["context"]:
            models[status["model"]]["context"] = status.get("max_model_len")
        self.set_resident(models)

    def set_loaded(self, model_id: str | None, context: int | None = None) -> None:
        """One loaded model (None: none), as an engine that holds one at a time says it."""
        self.set_resident({model_id: {"id": model_id, "state": "ready", "context": context}} if model_id else {})

    def set_resident(self, models: dict[str, dict]) -> None:
        if models != self._resident:
            self._resident = models
            self.refresh()

    def loaded_ids(self) -> list[str]:
        return list(self._resident)

    def model_ids(self) -> list[str]:
        return [self.table.item(r, 0).data(Qt.UserRole) for r in range(self.table.rowCount())]

    def selected_id(self) -> str | None:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        return self.table.item(rows[0].row(), 0).data(Qt.UserRole) if rows else None

    def select(self, model_id: str) -> None:
        for r in range(self.table.rowCount()):
            if self.table.item(r, 0).data(Qt.UserRole) == model_id:
                self.table.selectRow(r)

    # ---- actions (tests call these; the buttons call them too) ----
    def verify(self, model_id: str) -> FunctionWorker | None:
        self._status[model_id] = "verifying…"
        self.refresh()
        return self._run(self.store.verify, model_id, on_done=lambda ok, i=model_id: self._on_verified(i, ok))

    def import_file(self, path: str | Path) -> FunctionWorker | None:
        self.message.setText(f"Importing {Path(path).name}… (reading and hashing the file)")
        return self._run(self.store.import_path, Path(path), on_done=self._on_imported)

    def delete(self, model_id: str) -> None:
        """The model, its projector and its blocks in the KV disk tier, as `ember models rm` does."""
        outside = remove_model(self.store, self.settings.kv_cache_dir, model_id)
        self.message.setText(f"Deleted {model_id}" + (f"; left in place: {', '.join(outside)}" if outside else "."))
        self._status.pop(model_id, None)
        self.refresh()
        self.changed.emit()

    def set_chat_template(self, model_id: str, path: str | Path | None) -> bool:
        """Use the template in `path` for this model (None: the file's own again); the message
        says what happened, or why not (an unreadable file, a template that does not compile)."""
        try:
            source = None if path is None else Path(path).read_text(encoding="utf-8")
            self.store.set_chat_template(model_id, source)
        except (OSError, UnicodeDecodeError, ValueError, KeyError) as e:
            self.message.setText(f"Chat template not changed: {e}")
            return False
        what = "the chat template in its file" if path is None else f"the chat template in {Path(path).name}"
        self.message.setText(f"{model_id} uses {what} from its next load; Load to use it now.")
        self.refresh()
        self.changed.emit()
        return True

    def set_load_settings(self, model_id: str, load: LoadSettings) -> bool:
        """Save the model's context, device and threads for its loads; the message says so or why not."""
        try:
            self.store.set_load_settings(model_id, load)
        except (OSError, KeyError) as e:
            self.message.setText(f"Load settings not saved: {e}")
            return False
        now = " (it is loaded now; Unload it and Load it again to use them)" if model_id in self._resident else ""
        self.message.setText(f"{model_id} loads with these settings from now on{now}.")
        self.refresh()
        self.changed.emit()
        return True

    def set_default(self, model_id: str) -> None:
        self.settings.default_model = model_id
        self.settings.save()
        self.refresh()
        self.default_changed.emit(model_id)

    # ---- slots ----
    def _run(self, func, *args, on_done) -> FunctionWorker | None:
        if self._worker is not None and not self._worker.is_finished:
            self.message.setText("Another check is running; try again when it ends.")
            return None
        self._on_done = on_done
        self._worker = FunctionWorker(func, *args)
        self._worker.returned.connect(self._on_worker_returned)
        self._worker.errored.connect(self._on_worker_errored)
        self._worker.finished.connect(self._update_buttons)
        self._update_buttons()
        self._worker.start()
        return self._worker

    def _on_worker_returned(self, value: object) -> None:
        self._on_done(value)

    def _on_worker_errored(self, error: Exception) -> None:
        self.message.setText(f"Failed: {error}")
        self._status = {k: v for k, v in self._status.items() if v != "verifying…"}
        self.refresh()

    def _on_verified(self, model_id: str, ok: bool) -> None:
        self._status[model_id] = "✔ checksum OK" if ok else "✘ checksum mismatch or file missing"
        self.message.setText(f"{model_id}: {self._status[model_id]}")
        self.refresh()

    def _on_imported(self, manifest: ModelManifest) -> None:
        self.message.setText(f"Installed {manifest.name} as {manifest.id}.")
        self.refresh()
        self.select(manifest.id)
        self.changed.emit()

    def _on_load_clicked(self) -> None:
        if (model_id := self.selected_id()) is not None:
            self.message.setText(f"Loading {model_id}…")
            self.load_requested.emit(model_id)

    def on_load_finished(self, model_id: str, failure: str) -> None:
        """The engine's answer to Load: the failure in words, or that the model is ready."""
        self.message.setText(failure or f"{model_id} is loaded and ready.")

    def _on_unload_clicked(self) -> None:
        if (model_id := self.selected_id()) is not None and model_id in self._resident:
            self.message.setText(f"Unloading {model_id} (once its replies end)…")
            self.unload_requested.emit(model_id)

    def on_unload_finished(self, model_id: str, failure: str) -> None:
        self.message.setText(failure or f"{model_id or 'Every model'} is unloaded; its memory is free.")

    def _on_verify_clicked(self) -> None:
        if (model_id := self.selected_id()) is not None:
            self.verify(model_id)

    def _on_delete_clicked(self) -> None:
        model_id = self.selected_id()
        if model_id is None:
            return
        if QMessageBox.question(self, "Delete model", f"Delete {model_id} from this machine?") == QMessageBox.Yes:
            self.delete(model_id)

    def _on_default_clicked(self) -> None:
        if (model_id := self.selected_id()) is not None:
            self.set_default(model_id)

    def _on_template_clicked(self) -> None:
        model_id = self.selected_id()
        if model_id is None:
            return
        path, _ = QFileDialog.getOpenFileName(self, "Chat template", str(Path.home()),
                                              "Jinja templates (*.jinja *.j2 *.jinja2 *.txt);;All files (*)")
        if path:
            self.set_chat_template(model_id, path)

    def _on_load_settings_clicked(self) -> None:
        model_id = self.selected_id()
        manifest = self.store.get(model_id) if model_id is not None else None
        if manifest is None:
            return
        dialog = LoadSettingsDialog(manifest, self.store.load_settings(model_id), self.settings, self)
        if dialog.exec() == LoadSettingsDialog.Accepted:
            self.set_load_settings(model_id, dialog.value())

    def _on_import_clicked(self) -> None:
        # A GPTQ/AWQ checkpoint is a folder: picking its config.json imports the folder.
        path, _ = QFileDialog.getOpenFileName(self, "Import a model", str(Path.home()),
                                              "GGUF files, or a GPTQ/AWQ folder's config.json (*.gguf config.json)")
        if path:
            self.import_file(str(Path(path).parent) if Path(path).name == "config.json" else path)

    def _update_buttons(self) -> None:
        has = self.selected_id() is not None
        busy = self._worker is not None and not self._worker.is_finished
        self.load_button.setEnabled(has)
        self.unload_button.setEnabled(has and self.selected_id() in self._resident)
        self.template_button.setEnabled(has)
        self.load_settings_button.setEnabled(has)
        self.reset_template_button.setEnabled(has and self.store.chat_template(self.selected_id()) is not None)
        self.verify_button.setEnabled(has and not busy)
        self.delete_button.setEnabled(has)
        self.default_button.setEnabled(has)
        self.import_button.setEnabled(not busy)
