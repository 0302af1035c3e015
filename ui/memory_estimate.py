"""Settings' memory line: how much the engine takes for N chats of C tokens with the default model.

The figures are app.fit.memory_line's, which is the engine's own pool rule
(engine/model_files/memory.py); the two spin boxes only explore it and are not saved.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSpinBox, QVBoxLayout, QWidget

from app.fit import memory_line
from app.store import ModelStore


class MemoryEstimateRow(QWidget):
    """`update_engine(backend, device, dtype, kv_fraction)` when the dialog's engine fields change."""

    def __init__(self, settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._engine = (settings.backend, settings.device, settings.dtype, settings.kv_memory_fraction)
        try:
            self._model = ModelStore(settings.models_dir).get(settings.default_model)
        except (OSError, ValueError):
            self._model = None
        self.chats = QSpinBox(self, minimum=1, maximum=64, value=4, suffix=" chats")
        self.context = QSpinBox(self, minimum=256, maximum=131072, singleStep=256, value=4096, suffix=" tokens")
        self.text = QLabel(self, wordWrap=True, alignment=Qt.AlignLeft | Qt.AlignTop)
        row = QHBoxLayout()
        row.addWidget(self.chats)
        row.addWidget(self.context)
        row.addStretch(1)
        box = QVBoxLayout(self)
        box.setContentsMargins(0, 0, 0, 0)
        box.setSpacing(4)
        box.addLayout(row)
        box.addWidget(self.text)
        # A wrapped label in a form row is given the height of its text at a wider width than it gets
        # (the form asks once), and the estimate then shows 2 of its 4-5 lines: the row asks for the
        # spin boxes and 5 lines outright, as an explicit minimum is what the form honours.
        self.setMinimumHeight(self.chats.sizeHint().height() + box.spacing()
                              + 5 * self.text.fontMetrics().lineSpacing())
        self.chats.valueChanged.connect(self._refresh)
        self.context.valueChanged.connect(self._refresh)
        self._refresh()

    def update_engine(self, backend: str, device: str, dtype: str, kv_fraction: float) -> None:
        self._engine = (backend, device, dtype, kv_fraction)
        self._refresh()

    def _refresh(self) -> None:
        m = self._model
        if m is None:
            self.text.setText("Install or choose a default model to see its memory")
            return
        backend, device, dtype, fraction = self._engine
        self.text.setText(memory_line(m.size_bytes, m, backend=backend, device=device, dtype=dtype,
                                      kv_memory_fraction=fraction, context=self.context.value(),
                                      chats=self.chats.value()))
