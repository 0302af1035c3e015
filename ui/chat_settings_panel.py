"""Per-chat model and sampling settings: system prompt, temperature, top-p, max tokens, speculative
decoding, and whether a reasoning model thinks first (where its template can turn that off).

It shows `effective_settings` (the chat's own values over the model's recommendation over Ember's
defaults): the chat view sends that same dict, so an untouched chat sends what is on screen.
Below, the chat's MCP servers and tools (ui.chat_tools_section).
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout, QGroupBox, QLabel, QPlainTextEdit,
                               QSpinBox, QVBoxLayout, QWidget)

from app.sampling_defaults import EFFORTS, effective_settings
from ui.chat_documents_section import ChatDocumentsSection
from ui.chat_tools_section import ChatToolsSection


class ChatSettingsPanel(QWidget):
    """Edits one chat's settings; `settings_changed(dict)` and `model_changed(str)` on every edit."""

    settings_changed = Signal(dict)
    model_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._loading = False
        self.model = QComboBox(self)
        self.model.setToolTip("The model this chat talks to; the engine loads it when the chat sends")
        self.model.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.model.setMinimumContentsLength(12)
        self.model.view().setTextElideMode(Qt.ElideNone)  # the open list shows whole names
        self._model_names: dict[str, str] = {}
        self.set_models([])
        self.system_prompt = QPlainTextEdit(self, placeholderText="(none)")
        self.system_prompt.setToolTip("Instructions sent before the chat, e.g. \"Answer in one paragraph.\" "
                                      "Left empty, none is sent.")
        self.system_prompt.setMaximumHeight(110)
        self.temperature = QDoubleSpinBox(self, minimum=0.0, maximum=2.0, singleStep=0.05, decimals=2)
        self.temperature.setToolTip("How adventurous the wording is: 0 always picks the most likely word "
                                    "(the same answer each time); higher is more varied")
        self.top_p = QDoubleSpinBox(self, minimum=0.01, maximum=1.0, singleStep=0.05, decimals=2)
        self.top_p.setToolTip("Pick only among the most likely words that together make up this share "
                              "(1 = all of them)")
        self.max_tokens = QSpinBox(self, minimum=1, maximum=131072, singleStep=64)
        self.max_tokens.setToolTip("The longest reply, in tokens (a token is about ¾ of an English word)")
        # stored as the chat's "speculative" (True/False); off sends "speculative": "off" with its requests
        self.speculative = QCheckBox("Speculative decoding", self, checked=True)
        self._speculates = True  # the chat's own choice; the box shows it only while the engine speculates
        self.set_speculation_available(False)
        # stored as the chat's "think" (True/False); off sends chat_template_kwargs enable_thinking: false
        self.think = QCheckBox("Think before answering", self, checked=True)
        # stored as the chat's "effort" (None: the template's default); sent as reasoning_effort
        self.effort, self.effort_label = self._effort_choice()
        self.set_thinking_switch(False)
        self.set_effort_choice(False)
        self.source = QLabel(self, objectName="settingsSource", wordWrap=True)
        self.tools = ChatToolsSection(self)  # shown once the app hands it its MCP servers (set_tools)
        self.documents = ChatDocumentsSection(self)  # shown once the app hands it the engine (set_engine)
        self._lay_out()

        self.system_prompt.textChanged.connect(self._on_edited)
        self.temperature.valueChanged.connect(self._on_edited)
        self.top_p.valueChanged.connect(self._on_edited)
        self.max_tokens.valueChanged.connect(self._on_edited)
        self.speculative.toggled.connect(self._on_edited)
        self.think.toggled.connect(self._on_edited)
        self.effort.currentIndexChanged.connect(self._on_edited)
        self.model.currentIndexChanged.connect(self._on_model_edited)
        self.tools.changed.connect(self.settings_changed)  # only its own keys: the store merges them
        self.documents.changed.connect(self.settings_changed)
        self.load({}, None)

    def _lay_out(self) -> None:
        box = QGroupBox("Chat settings", self)
        form = QFormLayout(box)
        form.addRow(QLabel("Model", self))
        form.addRow(self.model)  # the whole width of the panel: names are long
        form.addRow("System prompt", self.system_prompt)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-p", self.top_p)
        form.addRow("Max tokens", self.max_tokens)
        form.addRow(self.speculative)  # the whole width: its words would widen the label column
        form.addRow(self.think)
        form.addRow(self.effort_label, self.effort)
        form.addRow(self.source)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 6, 6, 6)
        layout.addWidget(box)
        layout.addWidget(self.documents)
        layout.addWidget(self.tools)
        layout.addStretch(1)

    def load(self, settings: dict, model: str | None, model_defaults: dict | None = None) -> None:
        """Show a chat's effective settings (its own over the model's over Ember's) without emitting changes."""
        s = effective_settings(settings, model_defaults)
        from_model = sorted(k for k in (model_defaults or {}) if k not in (settings or {}))
        names = {"temperature": "temperature", "top_p": "top-p"}
        self.source.setText("Recommended by the model: " + ", ".join(names[k] for k in from_model)
                            if from_model else "")
        self.source.setVisible(bool(from_model))
        self._loading = True
        self.system_prompt.setPlainText(s["system_prompt"])
        self.temperature.setValue(float(s["temperature"]))
        self.top_p.setValue(float(s["top_p"]))
        self.max_tokens.setValue(int(s["max_tokens"]))
        self._speculates = s.get("speculative") is not False
        self.speculative.setChecked(self._speculates and self.speculative.isEnabled())
        self.think.setChecked(s.get("think") is not False)
        self.effort.setCurrentIndex(max(0, self.effort.findData(s.get("effort"))))
        self._select_model(model)
        self.tools.load(settings or {})
        self.documents.load(settings or {})
        self._loading = False

    def values(self) -> dict:
        return {"system_prompt": self.system_prompt.toPlainText(), "temperature": self.temperature.value(),
                "top_p": self.top_p.value(), "max_tokens": self.max_tokens.value(),
                "speculative": self._speculates, "think": self.think.isChecked(),
                "effort": self.effort.currentData()}

    def set_speculation_available(self, available: bool) -> None:
        """Whether the engine speculates at all (Settings → Engine): the box shows what the engine does
        (unticked while it does not speculate), and the chat's choice is kept for when it does."""
        self.speculative.setEnabled(available)
        loading, self._loading = self._loading, True
        self.speculative.setChecked(available and self._speculates)
        self._loading = loading
        self.speculative.setToolTip(
            "Drafts several words ahead and has the model check them in one go: faster replies on repetitive "
            "text and code, and the same reply. Off: this chat's replies are written one token at a time"
            if available else "Speculative decoding is off for the engine (Settings → Engine → Speculative "
                              "decoding); this chat's choice applies once it is on")

    def _effort_choice(self) -> tuple[QComboBox, QLabel]:
        box = QComboBox(self)
        box.addItem("Model's default", None)
        for level in EFFORTS:
            box.addItem(level.capitalize(), level)
        box.setToolTip("How long a reasoning model thinks before it answers (its template's "
                       "reasoning_effort): more effort, better answers to hard questions, slower")
        return box, QLabel("Reasoning effort", self)

    def set_effort_choice(self, available: bool) -> None:
        """Whether the loaded model's template takes a reasoning effort; shown only where it does."""
        self.effort.setVisible(available)
        self.effort_label.setVisible(available)

    def set_thinking_switch(self, available: bool) -> None:
        """Whether the loaded model's template can turn its thinking off; shown only where it can."""
        self.think.setVisible(available)
        self.think.setToolTip("A reasoning model thinks before it answers (shown apart, collapsed). Off: it "
                              "answers at once, faster, for simple questions")

    def current_model(self) -> str | None:
        """The chosen model's id; None for "whichever model the engine has loaded"."""
        return self.model.currentData() or None

    def set_models(self, models: list[str], names: dict[str, str] | None = None) -> None:
        """The models to choose from (ids), each shown by its one name (the id where two names clash)."""
        current = self.current_model()
        names = names or {}
        shown = [names.get(m) or m for m in models]
        self._loading = True
        self.model.clear()
        self.model.addItem("The loaded model", None)
        for model_id, name in zip(models, shown):
            label = f"{name} ({model_id})" if shown.count(name) > 1 else name
            self.model.addItem(label, model_id)
            self.model.setItemData(self.model.count() - 1, model_id, Qt.ToolTipRole)
        self._select_model(current)
        self._loading = False
        widest = max(self.model.fontMetrics().horizontalAdvance(self.model.itemText(i))
                     for i in range(self.model.count()))
        self.model.view().setMinimumWidth(widest + 40)  # the open list is as wide as its longest name

    def _select_model(self, model: str | None) -> None:
        i = self.model.findData(model) if model else 0
        if i < 0:  # a model this engine does not list (yet): keep it choosable
            self.model.addItem(model, model)
            i = self.model.count() - 1
        self.model.setCurrentIndex(i)

    def _on_edited(self, *_: object) -> None:
        if not self._loading:
            if self.speculative.isEnabled():
                self._speculates = self.speculative.isChecked()
            self.settings_changed.emit(self.values())

    def _on_model_edited(self, _index: int) -> None:
        if not self._loading:
            self.model_changed.emit(self.current_model() or "")
