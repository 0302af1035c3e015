"""Per-chat model and sampling settings: system prompt, temperature, top-p, max tokens."""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QComboBox, QDoubleSpinBox, QFormLayout, QGroupBox, QPlainTextEdit, QSpinBox,
                               QVBoxLayout, QWidget)

DEFAULTS = {"system_prompt": "", "temperature": 0.7, "top_p": 0.95, "max_tokens": 512}


class ChatSettingsPanel(QWidget):
    """Edits one chat's settings; `settings_changed(dict)` and `model_changed(str)` on every edit."""

    settings_changed = Signal(dict)
    model_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._loading = False
        self.model = QComboBox(self, editable=True)
        self.model.setToolTip("The model this chat talks to (the engine's models, or any id the server knows)")
        self.model.lineEdit().setPlaceholderText("the loaded model")
        self.system_prompt = QPlainTextEdit(self, placeholderText="You are a helpful assistant.")
        self.system_prompt.setMaximumHeight(110)
        self.temperature = QDoubleSpinBox(self, minimum=0.0, maximum=2.0, singleStep=0.05, decimals=2)
        self.temperature.setToolTip("0 = always the most likely token (greedy)")
        self.top_p = QDoubleSpinBox(self, minimum=0.01, maximum=1.0, singleStep=0.05, decimals=2)
        self.max_tokens = QSpinBox(self, minimum=1, maximum=131072, singleStep=64)

        box = QGroupBox("Chat settings", self)
        form = QFormLayout(box)
        form.addRow("Model", self.model)
        form.addRow("System prompt", self.system_prompt)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-p", self.top_p)
        form.addRow("Max tokens", self.max_tokens)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 6, 6, 6)
        layout.addWidget(box)
        layout.addStretch(1)

        self.system_prompt.textChanged.connect(self._on_edited)
        self.temperature.valueChanged.connect(self._on_edited)
        self.top_p.valueChanged.connect(self._on_edited)
        self.max_tokens.valueChanged.connect(self._on_edited)
        self.model.currentTextChanged.connect(self._on_model_edited)
        self.load({}, None)

    def load(self, settings: dict, model: str | None) -> None:
        """Show a chat's settings (missing keys take the defaults) without emitting changes."""
        s = {**DEFAULTS, **{k: v for k, v in (settings or {}).items() if v is not None}}
        self._loading = True
        self.system_prompt.setPlainText(s["system_prompt"])
        self.temperature.setValue(float(s["temperature"]))
        self.top_p.setValue(float(s["top_p"]))
        self.max_tokens.setValue(int(s["max_tokens"]))
        self.model.setCurrentText(model or "")
        self._loading = False

    def values(self) -> dict:
        return {"system_prompt": self.system_prompt.toPlainText(), "temperature": self.temperature.value(),
                "top_p": self.top_p.value(), "max_tokens": self.max_tokens.value()}

    def set_models(self, model_ids: list[str]) -> None:
        current = self.model.currentText()
        self._loading = True
        self.model.clear()
        self.model.addItems(model_ids)
        self.model.setCurrentText(current)
        self._loading = False

    def _on_edited(self, *_: object) -> None:
        if not self._loading:
            self.settings_changed.emit(self.values())

    def _on_model_edited(self, text: str) -> None:
        if not self._loading:
            self.model_changed.emit(text)
