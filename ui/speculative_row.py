"""The Settings dialog's "Speculative decoding" row: Off / Prompt lookup / Draft model, and which draft model.

It edits the `speculative` setting's value (app/speculative_setting.py): "off", "ngram", an
installed model's id or a .gguf file. The draft picker lists the installed models by name; a
file chosen with "File…" joins the list. Validation stays with the Settings model.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QFileDialog, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.speculative_setting import NGRAM, OFF, is_draft

DRAFT = "draft"
MODES = [("Off", OFF), ("Prompt lookup", NGRAM), ("Draft model", DRAFT)]
EXPLANATION = "Faster replies on repetitive text and code; the reply is the same."


class SpeculativeRow(QWidget):
    """`value()` is the setting's value; an empty string when Draft model has no model chosen yet."""

    def __init__(self, value: str, models: list[tuple[str, str]], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.mode = QComboBox(self)
        for label, data in MODES:
            self.mode.addItem(label, data)
        self.mode.setToolTip("Prompt lookup copies runs of the chat (quotes, code being edited) as drafts; a draft "
                             "model is a small model of the same family (same vocabulary) that guesses ahead.\n"
                             "The chat's model checks every draft, so the reply is exactly what it would write.")
        self.draft = QComboBox(self)
        self.draft.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.draft.setMinimumContentsLength(14)
        self.draft.setToolTip("The draft model: a smaller model with the same vocabulary as the chat's model")
        names = [name or model_id for model_id, name in models]
        for (model_id, _), name in zip(models, names):  # by name, as the chat's picker; the id where names clash
            self.draft.addItem(f"{name} ({model_id})" if names.count(name) > 1 else name, model_id)
            self.draft.setItemData(self.draft.count() - 1, model_id, Qt.ToolTipRole)
        self.browse = QPushButton("File…", self)
        self.browse.setToolTip("Use a .gguf file as the draft model")
        self.browse.clicked.connect(self._on_browse)
        self.note = QLabel(EXPLANATION, self, objectName="speculativeNote", wordWrap=True)
        self.note.setEnabled(False)  # drawn in the palette's muted colour, as a hint

        draft_row = QHBoxLayout()  # under the mode, so that the form's label column keeps its width
        draft_row.setContentsMargins(0, 0, 0, 0)
        draft_row.addWidget(self.draft, 1)
        draft_row.addWidget(self.browse)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(4)
        column.addWidget(self.mode)
        column.addLayout(draft_row)
        column.addWidget(self.note)

        self.set_value(value)
        self.mode.currentIndexChanged.connect(self._update_draft_visible)

    def set_value(self, value: str) -> None:
        if is_draft(value):
            self.mode.setCurrentIndex(self.mode.findData(DRAFT))
            self._select_draft(value)
        else:
            self.mode.setCurrentIndex(max(self.mode.findData(value), 0))
        self._update_draft_visible()

    def value(self) -> str:
        mode = self.mode.currentData()
        if mode != DRAFT:
            return mode
        return self.draft.currentData() or ""

    def _select_draft(self, value: str) -> None:
        i = self.draft.findData(value)
        if i < 0:  # a file, or a model no longer installed: keep it choosable under its own name
            self.draft.addItem(Path(value).name if value.lower().endswith(".gguf") else value, value)
            self.draft.setItemData(self.draft.count() - 1, value, Qt.ToolTipRole)  # the whole path
            i = self.draft.count() - 1
        self.draft.setCurrentIndex(i)

    def _update_draft_visible(self, *_: object) -> None:
        drafting = self.mode.currentData() == DRAFT
        self.draft.setVisible(drafting)
        self.browse.setVisible(drafting)
        # an explicit minimum, as for the memory row: a form row lays a wrapped note out a line short
        spacing = self.layout().spacing()
        lines = 2 * self.note.fontMetrics().lineSpacing()
        self.setMinimumHeight(self.mode.sizeHint().height() + spacing + lines
                              + (self.draft.sizeHint().height() + spacing if drafting else 0))

    def _on_browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a draft model", "", "GGUF models (*.gguf)")
        if path:
            self._select_draft(path)
