"""Settings' Memory group: the loaded model's real figures, then a "What if…" calculator.

"Loaded now" is what the engine reports on /v1/engine/status for the model it runs (backend,
device, weights, the KV it reserved, context, threads): `show_status(status)` each poll. The
calculator below it asks the engine's own pool rule (app.fit.memory_line, engine/model_files/
memory.py) how much N chats of C tokens would take with that model (or the default one when none
is loaded) under the dialog's engine fields; its two boxes only explore and are never saved.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSpinBox, QVBoxLayout, QWidget

from app.fit import memory_line
from app.store import ModelStore
from engine.model_files.footprint import default_context
from engine.model_files.meta import ModelFileError, read_meta

GiB, MiB = 1 << 30, 1 << 20


def _size(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB" if n >= 10 * MiB else f"{n / MiB:.1f} MiB"


def loaded_words(status: dict | None, name: str | None = None) -> str:
    """The engine's figures for the model it runs, in one paragraph (what it says when none runs)."""
    status = status or {}
    if not status.get("model") or status.get("status") != "ready":
        return {None: "The engine has not answered yet; its figures show once it runs a model.",
                "loading": "A model is loading; its figures follow once it is ready.",
                "unreachable": "The engine is not answering; its figures show once it runs a model."}.get(
            status.get("status"), "No model is loaded: load one to see what it takes.")
    parts = [f"{name or status['model']} runs on {status.get('backend') or '?'} ({status.get('device') or '?'}"
             + (f", {d}" if (d := (status.get("decision") or {}).get("dtype")) and status.get("backend") == "torch"
                else "") + ")"]
    if status.get("weight_bytes"):
        parts.append(f"weights {_size(status['weight_bytes'])}")
    kv = status.get("kv") or {}
    if kv.get("bytes_reserved"):
        parts.append(f"KV cache {_size(kv['bytes_reserved'])} reserved ({kv.get('blocks_total', 0):,} blocks of "
                     f"{kv.get('block_size', 0)} tokens, {kv.get('blocks_used', 0):,} in use)")
    if status.get("max_model_len"):
        parts.append(f"context {status['max_model_len']:,} tokens")
    if n := status.get("threads"):
        parts.append(f"{n} thread" + ("s" if n != 1 else ""))
    return ": ".join(parts[:1]) + ("; " if len(parts) > 1 else "") + ", ".join(parts[1:]) + "."


class MemoryEstimateRow(QWidget):
    """`show_status(status)` with each engine status; `update_engine(backend, device, dtype,
    kv_fraction)` when the dialog's engine fields change (the calculator follows them)."""

    def __init__(self, settings, parent: QWidget | None = None, status: dict | None = None) -> None:
        super().__init__(parent)
        self._settings, self._store = settings, ModelStore(settings.models_dir)
        self._engine = (settings.backend, settings.device, settings.dtype, settings.kv_memory_fraction)
        self._status: dict = {}
        self._model = None
        self._meta = None  # the chosen model's file header
        self.loaded = QLabel(self, wordWrap=True, alignment=Qt.AlignLeft | Qt.AlignTop, objectName="loadedFigures")
        self.loaded.setTextInteractionFlags(Qt.TextSelectableByMouse)
        line = QFrame(self, frameShape=QFrame.HLine, frameShadow=QFrame.Sunken)
        self.what_if = QLabel(self, wordWrap=True)
        self.chats = QSpinBox(self, minimum=1, maximum=64, value=4, suffix=" chats")
        self.context = QSpinBox(self, minimum=256, maximum=131072, singleStep=256, value=4096, suffix=" tokens")
        for box in (self.chats, self.context):
            box.setToolTip("A calculator: try numbers to see the memory they would take; nothing here is saved")
        self.text = QLabel(self, wordWrap=True, alignment=Qt.AlignLeft | Qt.AlignTop)
        row = QHBoxLayout()
        row.addWidget(self.chats)
        row.addWidget(QLabel("of", self))
        row.addWidget(self.context)
        row.addStretch(1)
        box = QVBoxLayout(self)
        box.setContentsMargins(0, 0, 0, 0)
        box.setSpacing(4)
        for w in (QLabel("<b>Loaded now</b>", self), self.loaded, line, self.what_if):
            box.addWidget(w)
        box.addLayout(row)
        box.addWidget(self.text)
        self.chats.valueChanged.connect(self._refresh)
        self.context.valueChanged.connect(self._refresh)
        self.show_status(status)

    def show_status(self, status: dict | None) -> None:
        """The engine's latest status: "Loaded now" shows its figures, the calculator its model."""
        self._status = dict(status or {})
        model_id = self._status.get("model") or self._settings.default_model
        if self._model is None or self._model.id != model_id:
            try:
                self._model = self._store.get(model_id) or self._store.get(self._settings.default_model)
                self._meta = file_meta(self._model.path) if self._model is not None else None
            except (OSError, ValueError):
                self._model = None
            if self._model is not None:  # start from the context this model runs with
                ctx = self._status.get("max_model_len") if self._status.get("model") == self._model.id else None
                own = self._model.context_length or 4096
                self.context.setValue(ctx or default_context(own, self._store.load_settings(self._model.id).context_length))
        m = self._model
        self.loaded.setText(loaded_words(self._status, m.name if m is not None and m.id == self._status.get("model")
                                         else None))
        self.what_if.setText(f"<b>What if…</b> a calculator, not a setting: the memory {m.name} would take for"
                             if m is not None else "<b>What if…</b> a calculator, not a setting")
        self._refresh()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._fit_labels()

    def _fit_labels(self) -> None:
        """A wrapped label in a dialog gets the height of its text at a wider width than it has (its
        layout asks once), and shows 2 of its 3-4 lines: each asks for its lines at this width."""
        for label in (self.loaded, self.what_if, self.text):
            label.setMinimumHeight(label.heightForWidth(max(self.width(), 400)))

    def update_engine(self, backend: str, device: str, dtype: str, kv_fraction: float) -> None:
        self._engine = (backend, device, dtype, kv_fraction)
        self._refresh()

    def _refresh(self) -> None:
        m = self._model
        if m is None:
            self.text.setText("Install or choose a default model to see its memory")
            self._fit_labels()
            return
        backend, device, dtype, fraction = self._engine
        device = self._store.load_settings(m.id).device or device  # the model's own device, as its loads use
        self.text.setText(memory_line(m.size_bytes, self._meta or m, backend=backend, device=device, dtype=dtype,
                                      kv_memory_fraction=fraction, context=self.context.value(),
                                      chats=self.chats.value()))
        self._fit_labels()


def file_meta(path: str):
    """The file's own header (which types its matrices have, so whether Ember's kernels run it), read
    once a model is chosen; None when it cannot be read (the manifest's facts then)."""
    try:
        return read_meta(Path(path))
    except (OSError, ModelFileError):
        return None
