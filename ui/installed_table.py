"""Installed models: verify (hash in a worker), delete, set as default, import a file."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QHeaderView, QLabel, QMessageBox, QPushButton,
                               QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from app.model_kind import COMPLETION, is_completion_model
from app.settings import Settings
from app.store import LoadSettings, ModelManifest, ModelStore
from engine.model_files.architectures import embeds_only
from ui.catalog_table import human_size
from ui.load_settings_dialog import LoadSettingsDialog, context_words
from ui.workers import FunctionWorker

COLUMNS = ("Model", "Architecture", "Quantization", "Size", "Context", "Uses", "Source", "Status")


def uses(architecture: str) -> tuple[str, str]:
    """What a model serves, and why: an embedding model only embeds; every chat model embeds too
    (its mean-pooled hidden states, on either runner)."""
    if embeds_only(architecture):
        return "embeddings", "An embedding model: /v1/embeddings, /v1/rerank and /api/embed; it cannot chat"
    return "chat, embeddings", "Chats, and /v1/embeddings from its mean-pooled hidden states"


class InstalledTable(QWidget):
    """Over app.store.ModelStore. `default_changed(id)` after Set as default; `changed()` after edits."""

    default_changed = Signal(str)
    changed = Signal()
    load_requested = Signal(str)  # Load: the engine loads this model now (the app connects it)

    def __init__(self, store: ModelStore, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.settings = settings
        self._worker: FunctionWorker | None = None  # one hashing job (verify or import) at a time
        self._status: dict[str, str] = {}
        self._loaded: str | None = None  # the engine's model now
        self._loaded_context: int | None = None  # the context the engine runs it with
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
        self.load_button.setToolTip("Load this model into the engine now (new chats use it)")
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
        for b in (self.load_button, self.verify_button, self.delete_button, self.default_button,
                  self.template_button, self.reset_template_button, self.load_settings_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        buttons.addWidget(self.import_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addWidget(self.message)
        layout.addLayout(buttons)
        self.load_button.clicked.connect(self._on_load_clicked)
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
            name = m.name + ("  ★ default" if m.id == self.settings.default_model else "")
            name += "  · custom chat template" if self.store.chat_template(m.id) is not None else ""
            item = QTableWidgetItem(name)
            item.setData(Qt.UserRole, m.id)
            item.setToolTip(f"{m.id}\n{m.path}\nsha256 {m.sha256}")
            self.table.setItem(row, 0, item)
            self.table.setItem(row, 1, QTableWidgetItem(m.architecture))
            self.table.setItem(row, 2, QTableWidgetItem(m.quantization if m.format == "gguf"
                                                        else f"{m.quantization} ({m.format})"))
            self.table.setItem(row, 3, QTableWidgetItem(human_size(m.size_bytes)))
            loaded = m.id == self._loaded
            text, why = context_words(m.context_length, self.store.load_settings(m.id).context_length,
                                      self._loaded_context if loaded else None)
            context = QTableWidgetItem(text)
            context.setToolTip(why)
            self.table.setItem(row, 4, context)
            use, why = uses(m.architecture)
            if use.startswith("chat") and is_completion_model(m.path, self.store.chat_template(m.id) is not None):
                use, why = COMPLETION, ("A base model: its file has no chat template, so it continues text rather "
                                        "than answering; best with /v1/completions, or set a chat template")
            use_item = QTableWidgetItem(use)
            use_item.setToolTip(why)
            self.table.setItem(row, 5, use_item)
            self.table.setItem(row, 6, QTableWidgetItem(m.source))
            self.table.setItem(row, 7, QTableWidgetItem(self._status.get(m.id) or ("● loaded" if loaded else "")))
            if loaded:  # the model the engine serves now stands out in every column
                for col in range(len(COLUMNS)):
                    font = self.table.item(row, col).font()
                    font.setBold(True)
                    self.table.item(row, col).setFont(font)
            if m.id == selected:
                self.table.selectRow(row)
        self._update_buttons()

    def set_loaded(self, model_id: str | None, context: int | None = None) -> None:
        """The model the engine has loaded (None: none), marked in its row, and the context it runs."""
        if (model_id, context) != (self._loaded, self._loaded_context):
            self._loaded, self._loaded_context = model_id, context
            self.refresh()

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
        self.store.delete(model_id)
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
        now = " (it is loaded now; Load it again to use them)" if model_id == self._loaded else ""
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
        self.template_button.setEnabled(has)
        self.load_settings_button.setEnabled(has)
        self.reset_template_button.setEnabled(has and self.store.chat_template(self.selected_id()) is not None)
        self.verify_button.setEnabled(has and not busy)
        self.delete_button.setEnabled(has)
        self.default_button.setEnabled(has)
        self.import_button.setEnabled(not busy)
