"""Which installed models are base models, for text completion rather than chat: marked in the
model manager and the chat's picker before one is loaded. Read from each file's metadata once
(per path and modification time); a custom chat template makes any model a chat model."""
from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

from app import store_vision
from app.store import ModelStore
from engine.model_files.chat_layout import completion_only

log = logging.getLogger(__name__)

COMPLETION = "text completion"


@functools.lru_cache(maxsize=256)
def _completion_only(path: str, _mtime: float) -> bool:
    try:
        return completion_only(path)
    except (OSError, ValueError) as e:  # unreadable now: say nothing rather than guess
        log.info("cannot read the chat template of %s: %s", path, e)
        return False


def is_completion_model(path: str | Path, custom_template: bool = False) -> bool:
    """A model with no chat template of its own (and none set by the user) and no ChatML tokens."""
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        return False
    return not custom_template and _completion_only(str(path), mtime)


def sees_images(models_dir: Path, model_id: str | None) -> bool | None:
    """Whether an installed model takes images: True when its manifest names its vision projector
    (`mmproj`) and the file is there, False when it names none; None when the store does not know the
    model (a file served by path, a remote server's), so the server's answer decides."""
    manifest = ModelStore(Path(models_dir)).get(model_id) if model_id else None
    if manifest is None:
        return None
    return store_vision.sees_images(manifest)
