"""One row of the Installed tab: a model's facts, what it serves, and whether the engine holds it now
(every loaded model is marked, and stands out in bold)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QTableWidget, QTableWidgetItem

from app.model_kind import COMPLETION, is_completion_model
from app.settings import Settings
from app.store import ModelManifest, ModelStore
from engine.model_files.architectures import embeds_only
from ui.catalog_table import human_size
from ui.load_settings_dialog import context_words

COLUMNS = ("Model", "Architecture", "Quantization", "Size", "Context", "Uses", "Source", "Status")
STATE_WORDS = {"ready": "● loaded", "loading": "◌ loading…"}  # a resident model's state in the Status column


def uses(architecture: str) -> tuple[str, str]:
    """What a model serves, and why: an embedding model only embeds; every chat model embeds too
    (its mean-pooled hidden states, on either runner)."""
    if embeds_only(architecture):
        return "embeddings", "An embedding model: /v1/embeddings, /v1/rerank and /api/embed; it cannot chat"
    return "chat, embeddings", "Chats, and /v1/embeddings from its mean-pooled hidden states"


def fill_row(table: QTableWidget, row: int, m: ModelManifest, store: ModelStore, settings: Settings,
             resident: dict | None, status: str) -> None:
    """Write model `m` into `row`; `resident` is its entry among the loaded models (None: not loaded),
    with the context the engine runs it with as "context" where known; `status` a check's result."""
    name = m.name + ("  ★ default" if m.id == settings.default_model else "")
    name += "  · custom chat template" if store.chat_template(m.id) is not None else ""
    item = QTableWidgetItem(name)
    item.setData(Qt.UserRole, m.id)
    item.setToolTip(f"{m.id}\n{m.path}\nsha256 {m.sha256}")
    table.setItem(row, 0, item)
    table.setItem(row, 1, QTableWidgetItem(m.architecture))
    table.setItem(row, 2, QTableWidgetItem(m.quantization if m.format == "gguf" else f"{m.quantization} ({m.format})"))
    table.setItem(row, 3, QTableWidgetItem(human_size(m.size_bytes)))
    text, why = context_words(m.context_length, store.load_settings(m.id).context_length,
                              (resident or {}).get("context"))
    context = QTableWidgetItem(text)
    context.setToolTip(why)
    table.setItem(row, 4, context)
    use, why = uses(m.architecture)
    if use.startswith("chat") and is_completion_model(m.path, store.chat_template(m.id) is not None):
        use, why = COMPLETION, ("A base model: its file has no chat template, so it continues text rather "
                                "than answering; best with /v1/completions, or set a chat template")
    use_item = QTableWidgetItem(use)
    use_item.setToolTip(why)
    table.setItem(row, 5, use_item)
    table.setItem(row, 6, QTableWidgetItem(m.source))
    state = STATE_WORDS.get((resident or {}).get("state", ""), "") if resident is not None else ""
    status_item = QTableWidgetItem(status or state)
    if resident is not None and resident.get("bytes"):
        status_item.setToolTip(f"Takes {human_size(resident['bytes'])} of the engine's memory for models")
    table.setItem(row, 7, status_item)
    for col in range(len(COLUMNS)):  # a model the engine holds now stands out in every column
        font = table.item(row, col).font()
        font.setBold(resident is not None)
        table.item(row, col).setFont(font)
