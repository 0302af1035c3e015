"""The loaded models as /v1/engine/status lists them, and what the window says about them: the
status bar's line and tooltip, the memory line, and a waiting reply's words. Qt-free.

Ember's engine lists several resident models (`models`, most recently used first), the requests
waiting for memory (`queue`) and the budget (`memory`); a remote server (vLLM, llama-server) has none
of these keys, so each function falls back to the one model the top-level fields describe.
"""
from __future__ import annotations

import re
import time
from collections.abc import Iterable

# what a short name leaves out of a store name: the quantization, "(Q4_1)", and the tuning words
_NOISE = re.compile(r"\([^)]*\)|\b(?:instruct|chat|it|awq|gptq|gguf|f16|bf16|fp16|q\d\w*|iq\d\w*)\b", re.I)


def resident(status: dict) -> list[dict]:
    """The loaded (or loading) models, most recently used first, each a dict with at least "id" and "state"."""
    models = status.get("models")
    if isinstance(models, list):
        return [m for m in models if isinstance(m, dict) and m.get("id")]
    model, state = status.get("model"), status.get("status")
    if not model or state in ("error", "unreachable", "unloaded"):
        return []
    return [{"id": model, "state": "loading" if state == "loading" else "ready",
             "embeds_only": bool(status.get("embeds_only")), "completion_only": bool(status.get("completion_only"))}]


def chatting_model(status: dict) -> str | None:
    """The most recently used loaded model that chats (not an embedding model that indexed documents)."""
    return next((m["id"] for m in resident(status) if not m.get("embeds_only")), None)


def entry(status: dict, model: str | None) -> dict | None:
    """The resident entry of `model`, or None when it is not loaded."""
    return next((m for m in resident(status) if m["id"] == model), None) if model else None


def queue_position(status: dict, model: str | None) -> int | None:
    """The 1-based place in line of the first request waiting for memory to load `model`; None when none waits."""
    for waiting in status.get("queue") or ():
        if isinstance(waiting, dict) and waiting.get("model") == model and model:
            return int(waiting.get("position") or 1)
    return None


def waits(status: dict) -> bool:
    """A request waits for memory or a model is loading: the window has news to show soon."""
    return bool(status.get("queue")) or any(m.get("state") == "loading" for m in resident(status))


def running(status: dict) -> int:
    """Replies in flight on every loaded model (the top-level count is the most recent model's)."""
    models = status.get("models")
    if isinstance(models, list):
        return sum(int(m.get("running") or 0) for m in models if isinstance(m, dict))
    return int(status.get("num_running") or 0)


def name_of(model: str, names: dict[str, str], status: dict | None = None) -> str:
    """A model's name: /v1/models' (the store's), else the one the status gives, else its id."""
    found = entry(status or {}, model) or {}
    return names.get(model) or found.get("name") or model


def short_name(name: str) -> str:
    """"SmolLM2 135M Instruct (Q4_1)" -> "SmolLM2 135M": a status bar's room for several models."""
    return " ".join(_NOISE.sub(" ", name).split()).strip(" -_.") or name


def pending_words(status: dict, model: str | None, names: dict[str, str]) -> str:
    """What a reply that has not begun waits for: memory (its place in line), or its model's load; "" for neither."""
    position = queue_position(status, model)
    if position is not None:
        ahead = position - 1
        return "Waiting for memory: " + ("next in line" if ahead <= 0 else f"{ahead} ahead")
    found = entry(status, model)
    if found is not None and found.get("state") == "loading":
        return f"Loading {name_of(model, names, status)}…"
    return ""


def _size(n: float | None) -> str:
    n = float(n or 0)
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def models_line(status: dict, names: dict[str, str], this_chat: str | None) -> str:
    """E.g. "SmolLM2 135M (this chat) · Qwen2.5 Coder 0.5B (loading…)", short names when several
    are loaded (and they stay apart; the tooltip has the whole ones); "" when none is loaded."""
    models = resident(status)
    full = [name_of(m["id"], names, status) for m in models]
    short = [short_name(n) for n in full]
    shown = short if len(models) > 1 and len(set(short)) == len(short) else full
    parts = []
    for m, name in zip(models, shown):
        words = [name]
        if m["id"] == this_chat:
            words.append("(this chat)")
        if m.get("state") == "loading":
            words.append("(loading…)")
        elif m.get("embeds_only"):
            words.append("(embeddings only)")
        parts.append(" ".join(words))
    if not parts:
        return ""
    return f"Model: {parts[0]}" if len(parts) == 1 else " · ".join(parts)  # several: the names say it


def chats_by_model(status: dict, chats: Iterable[tuple[str, str | None]]) -> dict[str, list[str]]:
    """Open chats' titles by the model each talks to (a chat without its own model: the most recent one)."""
    out: dict[str, list[str]] = {}
    for title, model in chats:
        model = model or status.get("model")
        if model:
            out.setdefault(model, []).append(title)
    return out


def models_tooltip(status: dict, names: dict[str, str], chats: Iterable[tuple[str, str | None]],
                   now: float | None = None) -> str:
    """One paragraph per loaded model: its name, memory, replies, which open chats use it, when it unloads."""
    users = chats_by_model(status, chats)
    now = time.time() if now is None else now
    lines = []
    for m in resident(status):
        model = m["id"]
        name = name_of(model, names, status)
        line = name + (f" ({model})" if name != model else "")
        if m.get("bytes"):
            line += f": {_size(m['bytes'])}"
            if m.get("weight_bytes") is not None and m.get("kv_bytes") is not None:
                line += f" (weights {_size(m['weight_bytes'])}, chat memory {_size(m['kv_bytes'])})"
        if m.get("state") == "loading":
            line += ", loading"
        if m.get("running"):
            line += f", writing {m['running']} {'reply' if m['running'] == 1 else 'replies'}"
        if users.get(model):
            line += "\n    used by: " + ", ".join(users[model])
        if m.get("expires_at"):
            minutes = max(0.0, float(m["expires_at"]) - now) / 60
            line += f"\n    unloads in {minutes:.0f} min if left idle" if minutes >= 1 else "\n    unloads soon if left idle"
        lines.append(line)
    for waiting in status.get("queue") or ():  # the models requests wait to load
        model = waiting.get("model") or "?"
        line = f"{name_of(model, names, status)}: waiting for memory, {int(waiting.get('position') or 1)} in line"
        lines.append(line + (f"\n    used by: {', '.join(users[model])}" if users.get(model) else ""))
    return "\n".join(lines)


def memory_line(status: dict) -> tuple[str, str]:
    """The memory the loaded models take of the budget, and its tooltip; ("", "") without a budget."""
    memory = status.get("memory")
    if not isinstance(memory, dict) or not memory.get("budget_bytes"):
        return "", ""
    used, budget = memory.get("used_bytes") or 0, memory["budget_bytes"]
    text = f"Models {_size(used)} of {_size(budget)}"
    tip = (f"The loaded models take {_size(used)} of the {_size(budget)} Ember lets them use (weights and chat "
           "memory); when a model needs more, the one left idle longest is unloaded first")
    if memory.get("rss_bytes"):
        tip += f".\nThe engine process uses {_size(memory['rss_bytes'])} in all"
    if memory.get("max_models"):
        tip += f"; at most {memory['max_models']} models at once"
    return text, tip + "."
