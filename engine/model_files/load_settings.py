"""A model's own load settings, next to its manifest: `<root>/<model_id>/load_settings.json`.

What the model manager's "Load settings…" saves for one installed model: its context length, the
device it runs on and the CPU threads. Every load of the model reads them (the engine's model
store puts them in its ModelSpec), so the model the engine starts with and a Load from the manager
run the same way. An unset field follows the app's settings (and the context the model's own,
capped: footprint.default_context). The app writes the file, the engine only reads it.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.model_files.manifest import validate_model_id

log = logging.getLogger(__name__)

LOAD_SETTINGS = "load_settings.json"
DEVICES = ("cpu", "cuda", "mps")
MAX_THREADS = 1024


@dataclass(frozen=True, slots=True)
class LoadSettings:
    context_length: int | None = None  # tokens of prompt + reply (None: the model's own, capped)
    device: str | None = None  # one of DEVICES (None: the app's device setting)
    threads: int | None = None  # CPU threads (None: the app's threads setting)

    def __post_init__(self) -> None:
        if self.context_length is not None and not (isinstance(self.context_length, int) and self.context_length >= 16):
            raise ValueError(f"context_length must be a whole number of at least 16, not {self.context_length!r}")
        if self.device is not None and self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, not {self.device!r}")
        if self.threads is not None and not (isinstance(self.threads, int) and 1 <= self.threads <= MAX_THREADS):
            raise ValueError(f"threads must be 1 to {MAX_THREADS}, not {self.threads!r}")

    @property
    def is_default(self) -> bool:
        return self == LoadSettings()

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict) -> LoadSettings:
        """The known fields of `d`; ValueError when one is out of range (unknown keys are ignored)."""
        if not isinstance(d, dict):
            raise ValueError("load settings must be a JSON object")
        return cls(**{k: d[k] for k in ("context_length", "device", "threads") if d.get(k) is not None})


def load_settings_path(root: Path, model_id: str) -> Path:
    return Path(root) / validate_model_id(model_id) / LOAD_SETTINGS


def read_load_settings(root: Path | None, model_id: str) -> LoadSettings:
    """The model's saved load settings; none saved, or a file that does not read, is the defaults
    (a damaged file must not stop the model from loading: the app's settings apply)."""
    if root is None:
        return LoadSettings()
    p = load_settings_path(root, model_id)
    if not p.is_file():
        return LoadSettings()
    try:
        return LoadSettings.from_dict(json.loads(p.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, ValueError, TypeError) as e:
        log.warning("ignoring %s: %s", p, e)
        return LoadSettings()
