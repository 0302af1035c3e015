"""What a chat sends: its own settings over the model's recommended sampling over Ember's defaults.

The settings panel shows `effective_settings(...)` and the chat view sends the same dict, so what is
on screen is what is sent. A model's recommendation comes from the model itself: the GGUF keys
`general.sampling.temp` / `general.sampling.top_p` (written by llama.cpp's converter from the
model's generation_config.json), or a generation_config.json next to a GPTQ/AWQ checkpoint.
Qt-free; no torch (the GGUF header reader is one of the shared model-file modules).
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from engine.model_files.gguf_file import GGUFFile, GGUFFormatError

log = logging.getLogger(__name__)

APP_DEFAULTS = {"system_prompt": "", "temperature": 0.7, "top_p": 0.95, "max_tokens": 512}
SAMPLING_KEYS = ("temperature", "top_p", "max_tokens")
_GGUF_KEYS = {"temperature": "general.sampling.temp", "top_p": "general.sampling.top_p"}
_BOUNDS = {"temperature": (0.0, 2.0), "top_p": (0.01, 1.0)}


def model_sampling_defaults(path: Path | str | None) -> dict:
    """{"temperature": .., "top_p": ..} where the model file recommends them; {} otherwise (never raises)."""
    if not path:
        return {}
    path = Path(path)
    raw: dict = {}
    try:
        if path.is_dir():
            config = path / "generation_config.json"
            if config.is_file():
                data = json.loads(config.read_text(encoding="utf-8"))
                raw = {k: data.get(k) for k in ("temperature", "top_p")} if isinstance(data, dict) else {}
        elif path.is_file():
            with GGUFFile(path) as header:
                raw = {name: header.get(key) for name, key in _GGUF_KEYS.items()}
    except (OSError, ValueError, GGUFFormatError) as e:
        log.debug("no sampling defaults from %s: %s", path, e)
        return {}
    out = {}
    for name, value in raw.items():
        lo, hi = _BOUNDS[name]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= float(value) <= hi:
            out[name] = round(float(value), 4)
    return out


EFFORTS = ("low", "medium", "high")  # a reasoning model's effort, where its template takes one


def effective_settings(chat_settings: dict | None, model_defaults: dict | None = None) -> dict:
    """Ember's defaults < the model's recommendation < what the user set for this chat (None = unset)."""
    chosen = {k: v for k, v in (chat_settings or {}).items() if v is not None}
    return {**APP_DEFAULTS, **(model_defaults or {}), **chosen}


def request_fields(settings: dict) -> tuple[str | None, dict]:
    """(system prompt or None, the request keywords for `chat_stream`) of an effective settings
    dict; a chat that turned thinking off asks the template for it (enable_thinking: false).
    Max tokens is a cap: a reply near the context's end stops there rather than being refused."""
    system = (settings.get("system_prompt") or "").strip() or None
    fields = {k: settings[k] for k in SAMPLING_KEYS} | {"max_tokens_fit": True}
    if settings.get("think") is False:
        fields["chat_template_kwargs"] = {"enable_thinking": False}
    if settings.get("effort") in EFFORTS:  # None: the template's own default
        fields["reasoning_effort"] = settings["effort"]
    return system, fields


def store_defaults(store) -> Callable[[str | None], dict]:
    """model id -> its recommended sampling, read once per installed file (a ModelStore's models)."""
    cache: dict[tuple[str, str], dict] = {}

    def defaults(model_id: str | None) -> dict:
        manifest = store.get(model_id) if model_id else None
        if manifest is None:
            return {}
        key = (manifest.id, manifest.path)
        if key not in cache:
            cache[key] = model_sampling_defaults(manifest.path)
        return cache[key]

    return defaults
