"""Preferences over app.settings.Settings: paths, server, backend and device, KV memory, theme, connection
(the General tab), and the MCP servers with the limits of tool calls (the Tools tab, ui.tools_settings).

The dialog edits a copy; `accept()` validates it through the Settings model (its bounds are the
single source of truth) and shows the error instead of closing when a value is rejected.
"""
from __future__ import annotations

from pathlib import Path

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from PySide6.QtCore import Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFileDialog,
                               QFormLayout, QFrame, QGroupBox, QHBoxLayout, QLabel, QLineEdit, QPushButton,
                               QScrollArea, QSpinBox, QTabWidget, QVBoxLayout, QWidget)

from app.settings import Settings
from ui.memory_estimate import MemoryEstimateRow
from ui.speculative_row import SpeculativeRow
from ui.tools_settings import ToolsPage


class PathEdit(QWidget):
    """A line edit with a Browse… button for a folder."""

    def __init__(self, value: Path | str | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.edit = QLineEdit(str(value or ""), self)
        browse = QPushButton("Browse…", self)
        browse.clicked.connect(self._on_browse)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.edit, 1)
        row.addWidget(browse)

    def text(self) -> str:
        return self.edit.text().strip()

    def _on_browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Choose a folder", self.text())
        if folder:
            self.edit.setText(folder)


class SettingsDialog(QDialog):
    """`settings_saved(new_settings)` after a valid edit was written to disk."""

    settings_saved = Signal(object)

    def __init__(self, settings: Settings, parent: QWidget | None = None,
                 models: list[tuple[str, str]] | None = None, engine_status: dict | None = None,
                 tools: Any = None, tool_states: Any = None, show_log: Callable[[], object] | None = None,
                 embedders: list[tuple[str, str]] | None = None) -> None:
        """`models`: the installed models as (id, name), which the draft-model picker offers;
        `engine_status`: the engine's last /v1/engine/status (`memory.show_status` takes later ones);
        `tools`, `tool_states`, `show_log`: the app's ChatTools, its ServerStates and the log dialog's opener;
        `embedders`: the installed embedding models as (id, name), for documents."""
        super().__init__(parent)
        self.setWindowTitle("Ember settings")
        self.setMinimumWidth(620)
        self.settings = settings
        self._make_fields(settings, models or [])
        self.embedding_model = self._embedder_choice(settings.embedding_model, embedders or [])
        self.tools_page = ToolsPage(settings, tools, tool_states, show_log, self)
        self._lay_out(settings, engine_status)
        self._explain()

    def _make_fields(self, s: Settings, models: list[tuple[str, str]]) -> None:
        """One widget per field, holding the current value (made in the order Tab walks them)."""
        self.data_dir = PathEdit(s.data_dir, self)
        self.models_dir = PathEdit(s.models_dir, self)
        self.server_port = QSpinBox(self, minimum=0, maximum=65535, value=s.server_port)
        self.server_port.setSpecialValueText("any free port")
        self.ollama_port = QSpinBox(self, minimum=0, maximum=65535, value=s.ollama_port)
        self.ollama_port.setSpecialValueText("off")
        self.ollama_port.setToolTip("Also listen here for programs that expect Ollama (its port is 11434)")
        self.ollama_keyless = QCheckBox("without the key", self, checked=s.ollama_keyless)
        self.ollama_keyless.setToolTip("Programs on this computer may use the Ollama port without the API key, "
                                       "as Ollama's own clients expect. The key is still needed on Ember's port, "
                                       "and web pages are still refused")
        self.ollama_port.valueChanged.connect(lambda port: self.ollama_keyless.setEnabled(port > 0))
        self.ollama_keyless.setEnabled(s.ollama_port > 0)
        self.api_key = QLineEdit(s.api_key, self, echoMode=QLineEdit.Password)
        self.fetch_image_urls = QCheckBox("Fetch images sent as web addresses", self, checked=s.fetch_image_urls)
        self.show_key = QCheckBox("Show", self)
        self.show_key.toggled.connect(self._on_show_key)
        self.copy_key = QPushButton("Copy", self)
        self.copy_key.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.api_key.text()))
        self.backend = self._combo(["auto", "torch", "llama.cpp"], s.backend)
        self.device = self._combo(["auto", "cpu", "cuda", "mps"], s.device)
        self.dtype = self._combo(["auto", "float32", "bfloat16", "float16"], s.dtype)
        # a share of the memory free after the weights, in the user's words: a percentage
        self.kv_fraction = QSpinBox(self, minimum=1, maximum=95, singleStep=5, suffix="% of free memory",
                                    value=round(s.kv_memory_fraction * 100))
        self.threads = QSpinBox(self, minimum=0, maximum=1024, value=s.threads or 0)
        self.threads.setSpecialValueText("automatic")
        self.speculative = SpeculativeRow(s.speculative, models, self)
        self._make_residency_fields(s)
        self.theme = self._combo(["system", "light", "dark"], s.theme)
        self.close_to_tray = QCheckBox("Closing the window keeps the engine serving from the tray", self,
                                       checked=s.close_to_tray)
        self.connection_url = QLineEdit(s.connection_url or "", self,
                                        placeholderText="empty: the local engine; e.g. http://host:8000/v1")
        self.connection_key = QLineEdit(s.connection_key or "", self, echoMode=QLineEdit.Password)
        self.error = QLabel(self, wordWrap=True)
        self.error.setStyleSheet("color: #c92a2a")

    def _make_residency_fields(self, s: Settings) -> None:
        """The models kept loaded at once: their memory together, how many, how long an idle one stays."""
        self.memory_budget = QDoubleSpinBox(self, minimum=0.0, maximum=65536.0, decimals=1, singleStep=1.0,
                                            suffix=" GiB", value=s.memory_budget_gb)
        self.memory_budget.setSpecialValueText("automatic (75% of memory)")
        self.max_loaded_models = QSpinBox(self, minimum=1, maximum=16, value=s.max_loaded_models)
        self.kv_disk = QDoubleSpinBox(self, minimum=0.0, maximum=65536.0, decimals=1, singleStep=1.0,
                                      suffix=" GiB", value=s.kv_disk_gib)
        self.kv_disk.setSpecialValueText("off")
        self.keep_alive = QLineEdit(s.keep_alive, self, placeholderText="5m")

    def _lay_out(self, s: Settings, engine_status: dict | None) -> None:
        """The fields in their groups, the loaded model's memory and the calculator after the engine's, Save and Cancel."""
        key_row = QHBoxLayout()
        key_row.addWidget(self.api_key, 1)
        key_row.addWidget(self.show_key)
        key_row.addWidget(self.copy_key)
        ollama_row = QHBoxLayout()
        ollama_row.addWidget(self.ollama_port, 1)
        ollama_row.addWidget(self.ollama_keyless)
        general = QWidget(self)
        layout = QVBoxLayout(general)
        layout.addWidget(self._group("Storage", [("Data folder", self.data_dir), ("Models folder", self.models_dir)]))
        layout.addWidget(self._group("Local server", [("Port", self.server_port),
                                                      ("Ollama's port too", ollama_row),
                                                      ("Key for other programs", key_row),
                                                      ("", self.fetch_image_urls),
                                                      ("", self.close_to_tray)]))
        self.memory = MemoryEstimateRow(s, self, engine_status)  # the loaded model's figures; What if…
        for signal in (self.backend.currentTextChanged, self.device.currentTextChanged,
                       self.dtype.currentTextChanged, self.kv_fraction.valueChanged):
            signal.connect(lambda *_: self.memory.update_engine(self.backend.currentText(), self.device.currentText(),
                                                                self.dtype.currentText(), self.kv_fraction.value() / 100))
        layout.addWidget(self._group("Engine", [("Backend", self.backend), ("Device", self.device), ("Precision", self.dtype),
                                                ("Memory for chats", self.kv_fraction), ("Threads", self.threads),
                                                ("Speculative decoding", self.speculative),
                                                ("Memory for models", self.memory_budget),
                                                ("Models at once", self.max_loaded_models),
                                                ("Unload an unused model after", self.keep_alive),
                                                ("Disk for chats' context", self.kv_disk)]))
        memory = QGroupBox("Memory", self)
        QVBoxLayout(memory).addWidget(self.memory)
        layout.addWidget(memory)
        layout.addWidget(self._group("Connection", [("Server URL", self.connection_url),
                                                    ("Server's key", self.connection_key)]))
        layout.addWidget(self._group("Documents", [("Embedding model", self.embedding_model)]))
        layout.addWidget(self._group("Appearance", [("Theme", self.theme)]))
        scroll = QScrollArea(self, widgetResizable=True, frameShape=QFrame.NoFrame)  # fits a laptop's screen
        scroll.setWidget(general)
        scroll.setMinimumWidth(general.sizeHint().width() + scroll.verticalScrollBar().sizeHint().width())
        self.tabs = QTabWidget(self)
        self.tabs.addTab(scroll, "General")
        self.tabs.addTab(self.tools_page, "Tools")
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs)
        layout.addWidget(self.error)
        buttons = QDialogButtonBox(QDialogButtonBox.Save | QDialogButtonBox.Cancel, self)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        screen = (self.screen() or QGuiApplication.primaryScreen()).availableGeometry()
        self.resize(self.sizeHint().width(), min(general.sizeHint().height() + 140, int(screen.height() * 0.9)))

    def _explain(self) -> None:
        """Tooltips for the fields whose label alone does not say enough."""
        self.kv_fraction.setToolTip("Share of the memory left after the model's weights that holds the chats' "
                                    "context (the KV cache): 0.25 is a quarter. More lets longer or more chats run")
        self.kv_disk.setToolTip("A long chat answers at once after a restart: its context (the KV cache) is "
                                "kept on disk, in the data folder; the least recently used goes first")
        self.api_key.setToolTip("Programs that use Ember's server send this key (Authorization: Bearer …)")
        self.fetch_image_urls.setToolTip("A program may send an image as an http(s) address instead of its data. "
                                         "On: the engine then makes requests to the URLs clients send. Off: such "
                                         "a request is refused and the image must be sent as data")
        self.connection_key.setToolTip("The key the remote server asks for, if any")
        self.memory_budget.setToolTip("Memory the loaded models may use together (their weights and chats). "
                                      "When a new one does not fit, the one unused the longest is unloaded")
        self.max_loaded_models.setToolTip("How many models stay loaded at the same time, e.g. a chat model "
                                          "and an embedding model, or the models two chats use")
        self.keep_alive.setToolTip("How long a model nobody uses stays loaded: 5m, 1h30m or seconds; "
                                   "-1 keeps it loaded, 0 unloads it at once. A program may ask otherwise "
                                   "(Ollama's keep_alive)")
        self.dtype.setToolTip("Weights and KV cache of the torch backend. auto: bf16 on GPUs and on CPUs with "
                              "fast bf16 (AVX512-BF16, AMX), float32 elsewhere; llama.cpp keeps the file's quantization")

    def values(self) -> dict:
        """The edited fields as Settings field values."""
        return {
            "data_dir": self.data_dir.text(), "models_dir": self.models_dir.text() or None,
            "server_port": self.server_port.value(), "ollama_port": self.ollama_port.value(),
            "ollama_keyless": self.ollama_keyless.isChecked(),
            "api_key": self.api_key.text().strip(), "fetch_image_urls": self.fetch_image_urls.isChecked(),
            "backend": self.backend.currentText(), "device": self.device.currentText(),
            "dtype": self.dtype.currentText(),
            "kv_memory_fraction": self.kv_fraction.value() / 100, "threads": self.threads.value() or None,
            "speculative": self.speculative.value(),
            "memory_budget_gb": round(self.memory_budget.value(), 1), "max_loaded_models": self.max_loaded_models.value(),
            "kv_disk_gib": round(self.kv_disk.value(), 1),
            "keep_alive": self.keep_alive.text().strip() or Settings.model_fields["keep_alive"].default,
            "theme": self.theme.currentText(), "close_to_tray": self.close_to_tray.isChecked(),
            "connection_url": self.connection_url.text().strip() or None,
            "connection_key": self.connection_key.text().strip() or None,
            "embedding_model": self.embedding_model.currentData(),
            "tool_step_limit": self.tools_page.step_limit.value(), "tool_timeout_s": self.tools_page.timeout.value(),
        }

    def accept(self) -> None:
        """Validate all fields first, then assign and save; a rejected value keeps the dialog open."""
        values = self.values()
        derived = str(Path(self.settings.data_dir) / "models")
        if values["models_dir"] == derived and self.settings.models_dir == Path(derived):
            values["models_dir"] = None  # it followed the data folder; keep following it
        try:
            type(self.settings).model_validate({**self.settings.model_dump(), **values})
        except ValueError as e:  # pydantic.ValidationError is a ValueError
            self.error.setText(_short_error(e))
            return
        for name, value in values.items():
            if getattr(self.settings, name) != value and not (name.endswith("_dir") and value
                                                               and Path(value) == getattr(self.settings, name)):
                setattr(self.settings, name, value)
        self.settings.save()
        self.error.clear()
        self.settings_saved.emit(self.settings)
        super().accept()

    def _combo(self, items: list[str], current: str) -> QComboBox:
        box = QComboBox(self)
        box.addItems(items)
        box.setCurrentText(current)
        return box

    def _embedder_choice(self, current: str | None, embedders: list[tuple[str, str]]) -> QComboBox:
        """The installed embedding models; the first item leaves the choice to the engine."""
        box = QComboBox(self)
        box.addItem("The first installed one" if embedders else "None installed (Models → Model manager)", None)
        for model_id, name in embedders + ([(current, current)] if current and current not in dict(embedders) else []):
            box.addItem(name, model_id)
        box.setCurrentIndex(max(0, box.findData(current)))
        box.setToolTip("The model that indexes your documents and searches them for a chat's question. "
                       "Changing it indexes every collection again; the engine takes it on its next start")
        return box

    def _group(self, title: str, rows: list) -> QGroupBox:
        box = QGroupBox(title, self)
        form = QFormLayout(box)
        for label, widget in rows:
            form.addRow(label, widget) if label else form.addRow(widget)
        return box

    def _on_show_key(self, shown: bool) -> None:
        self.api_key.setEchoMode(QLineEdit.Normal if shown else QLineEdit.Password)


def _short_error(e: ValueError) -> str:
    if isinstance(e, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
    return str(e)
