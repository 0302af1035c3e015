"""The `speculative` setting: off, prompt lookup ("ngram") or a draft model, and the engine flag it becomes.

A draft model is kept as the user picked it: an installed model's id, resolved to its file each
time the engine starts (as every model id is, through the store, so a model that moved or was
re-downloaded is still found), or a .gguf file. The engine takes `--speculative off|ngram|draft:PATH`.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

OFF, NGRAM = "off", "ngram"
_MODEL_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")  # engine/model_files/manifest.py's ids


def check_speculative(value: str) -> str:
    """The setting's validator: "off", "ngram", a model id or a .gguf path ("draft:" in front is accepted)."""
    text = str(value).strip()
    text = text.removeprefix("draft:").strip() if text.startswith("draft:") else text
    if text in (OFF, NGRAM) or _MODEL_ID.match(text) or (text.lower().endswith(".gguf") and len(text) > 5):
        return text
    if not text:
        raise ValueError("a draft model needs an installed model or a .gguf file")
    raise ValueError(f"must be off, ngram, an installed model's id or a .gguf file, not {value!r}")


def is_draft(value: str) -> bool:
    return value not in (OFF, NGRAM)


def engine_speculative(value: str, models_dir: Path | str | None) -> str:
    """The `--speculative` value for the setting `value`. A draft model that cannot be found turns
    speculation off (with a warning in the log) rather than keeping the engine from starting."""
    if not is_draft(value):
        return value
    if _MODEL_ID.match(value) and models_dir is not None:
        from app.store import ModelStore  # lazily: the store reads manifests, this module only checks text

        manifest = ModelStore(Path(models_dir)).get(value)
        if manifest is not None:
            return f"draft:{manifest.path}"
    path = Path(value).expanduser()
    if value.lower().endswith(".gguf") and path.is_file():
        return f"draft:{path.resolve()}"
    log.warning("the draft model %r is neither an installed model nor a .gguf file; "
                "the engine runs without speculative decoding", value)
    return OFF
