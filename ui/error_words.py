"""Failures in a person's words: a failed reply (the server's error codes mapped to what to do next,
never an API's instructions such as "POST /v1/engine/load" in a chat) and a refused load. Qt-free."""
from __future__ import annotations

import re

from app.client import EngineClientError

# the server's `code` -> what the chat says (Ember's engine; other servers' words pass through)
BY_CODE = {
    "model_loading": "The model is still loading. Press Regenerate in a moment.",
    "model_not_loaded": "No model is loaded. Choose one in the model picker or the model manager, "
                        "then press Regenerate.",
    "model_not_found": "This chat's model is not installed any more. Choose another in the model picker, "
                       "then press Regenerate.",
    "queue_full": "Too many chats are waiting for memory to load their models. Press Regenerate in a moment, "
                  "or unload a model in the model manager.",
}
LOAD_FAILED = re.compile(r"loading '?(?P<model>[^' ]+)'? failed: ")  # the engine's words for a refused load


def reply_error_text(error: Exception, remote: bool) -> str:
    """The line a chat shows under a reply that failed."""
    if isinstance(error, EngineClientError):
        if error.code in BY_CODE:
            return BY_CODE[error.code]
        if error.code == "model_load_failed" and (m := LOAD_FAILED.match(error.message)):
            return load_failure_words(m["model"], error) + " Choose another model in the picker, then press Regenerate."
        if error.status_code is None and not remote:  # the connection went: the engine may have crashed
            return f"{error.message}. If the engine stopped, Ember restarts it: press Regenerate to try again."
    return str(error) or type(error).__name__


def load_failure_words(model_id: str, error: Exception) -> str:
    """The engine's refusal as a sentence: "Could not load X: why." and which model still serves."""
    text = getattr(error, "message", None) or str(error)
    for prefix in (f"loading {model_id!r} failed: ", f"loading {model_id} failed: "):
        text = text.removeprefix(prefix)
    reason, still = text, ""
    for kept in (" is loaded again", " is still loaded", " are still loaded"):  # what serves (again, or throughout)
        if text.endswith(kept) and "; " in text:
            reason, _, restored = text.rpartition("; ")
            first, _, last = restored.removesuffix(kept).rpartition(", ")  # "a, b, c" -> "a, b and c"
            still = f" {first} and {last} are still loaded." if first else f" {last} is still loaded."
    return f"Could not load {model_id}: {reason.rstrip('.')}.{still}"
