"""The model manager's "Load settings…": one installed model's context length, device and threads.

Saved next to the model's manifest (app.store.ModelStore.set_load_settings); the engine reads them
on every load of that model, the one it starts with and a Load from the manager alike. What the
Installed tab's Context column says is `context_words`: the context the engine will run.
"""
from __future__ import annotations

from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QFormLayout, QLabel, QSpinBox, QVBoxLayout,
                               QWidget)

from app.settings import Settings
from app.store import LoadSettings, ModelManifest
from engine.model_files.footprint import default_context
from engine.model_files.load_settings import DEVICES, MAX_THREADS


def context_words(model_context: int | None, setting: int | None, engine: int | None = None) -> tuple[str, str]:
    """(cell text, tooltip) for the Context column: the context the engine runs the model with
    (`engine`: what the running engine reports for the loaded model), out of the model's own."""
    if not model_context:
        return (f"{setting:,}" if setting else "?"), "The model's file does not say its context length"
    runs = engine or default_context(model_context, setting)
    why = ("as set in Load settings…" if setting else "the engine's default; change it in Load settings…")
    if runs < model_context:
        return f"{runs:,} of {model_context:,}", f"The engine runs {runs:,} tokens of the model's {model_context:,} ({why})"
    return f"{model_context:,}", f"The engine runs the model's whole context, {model_context:,} tokens"


class LoadSettingsDialog(QDialog):
    """Edits one model's LoadSettings; `value()` is the result once accepted."""

    def __init__(self, manifest: ModelManifest, current: LoadSettings, settings: Settings,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Load settings — {manifest.name}")
        own = manifest.context_length or 0
        self.context = QSpinBox(self, minimum=0, maximum=max(own, 16) if own else 1 << 20, singleStep=256,
                                suffix=" tokens", value=current.context_length or 0)
        auto = default_context(own) if own else None
        self.context.setSpecialValueText(f"the engine's default ({auto:,} tokens)" if auto else "the engine's default")
        self.context.setToolTip(f"Prompt and reply together; this model's own is {own:,} tokens. Longer takes more "
                                "memory for each chat" if own else "Prompt and reply together")
        self.device = QComboBox(self)
        self.device.addItem(f"as in Settings ({settings.device})", None)
        for d in DEVICES:
            self.device.addItem({"cpu": "CPU", "cuda": "GPU (CUDA)", "mps": "GPU (Apple, MPS)"}[d], d)
        self.device.setCurrentIndex(max(self.device.findData(current.device), 0))
        self.threads = QSpinBox(self, minimum=0, maximum=MAX_THREADS, value=current.threads or 0)
        self.threads.setSpecialValueText(f"as in Settings ({settings.threads or 'automatic'})")
        self.threads.setToolTip("CPU threads this model computes with")
        note = QLabel("Used every time this model loads: when the engine starts with it and when you press Load. "
                      "A model that is loaded now takes them at its next load.", self, wordWrap=True)
        form = QFormLayout()
        form.addRow("Context length", self.context)
        form.addRow("Runs on", self.device)
        form.addRow("Threads", self.threads)
        buttons = QDialogButtonBox(QDialogButtonBox.Save | QDialogButtonBox.Cancel, self)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(note)
        layout.addWidget(buttons)

    def value(self) -> LoadSettings:
        ctx = self.context.value()
        return LoadSettings(context_length=max(ctx, 16) if ctx else None, device=self.device.currentData(),
                            threads=self.threads.value() or None)
