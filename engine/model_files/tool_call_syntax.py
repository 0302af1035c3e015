"""Tool calls in a model's own syntax: which syntax its chat template uses, and how to parse a
reply into calls. Torch-free and grammar-free, so the server (engine/server/tool_calls.py, which
adds the grammar that forces a call) and the desktop transcript read replies the same way.

The family comes from the template text, never the file name (a fine-tune keeps its base's
template and renames the file):
- Hermes / Qwen2.5: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one per call;
- Llama 3.x: the reply is `{"name": ..., "parameters": {...}}` (after an optional <|python_tag|>),
  several separated by `;`;
- Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`;
- Harmony (gpt-oss): a message addressed to the function,
  `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`,
  read from the raw reply with its markup (the reasoning parser keeps such messages out of both
  reasoning and content).
"""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from enum import StrEnum


class ToolFormat(StrEnum):
    HERMES = "hermes"
    LLAMA3 = "llama3"
    MISTRAL = "mistral"
    HARMONY = "harmony"


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text
    id: str

    def as_openai(self, index: int | None = None) -> dict:
        d = {"id": self.id, "type": "function",
             "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            d["index"] = index
        return d


def tool_format(template_source: str) -> ToolFormat | None:
    """The tool-call syntax a chat template teaches its model; None: it has no tool support."""
    src = template_source
    if "tools" not in src:
        return None
    if "<tool_call>" in src:
        return ToolFormat.HERMES
    if "to=functions" in src or "<|call|>" in src:
        return ToolFormat.HARMONY
    if "[TOOL_CALLS]" in src:
        return ToolFormat.MISTRAL
    if "<|start_header_id|>" in src and ("parameters" in src or "<|python_tag|>" in src):
        return ToolFormat.LLAMA3
    return None


def call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


# ---- parsing ----------------------------------------------------------------------------------
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
# a harmony message to a function: its recipient in the header, its JSON arguments as the body
_HARMONY = re.compile(r"to=functions\.([^\s<]+)[^<]*(?:<\|constrain\|>[^<]*)?<\|message\|>(.*?)"
                      r"(?=<\|call\|>|<\|end\|>|<\|start\|>|$)", re.DOTALL)


def _call(obj, args_key: str) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", {}))
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ParsedCall(obj["name"], text, call_id())


def _loads(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def parse_tool_calls(fmt: ToolFormat, text: str) -> tuple[str, list[ParsedCall]]:
    """(the reply's plain content, its tool calls); text that does not parse stays content."""
    if fmt is ToolFormat.HERMES:
        calls = [_call(_loads(m.group(1)), "arguments") for m in _HERMES.finditer(text)]
        if not calls or any(c is None for c in calls):
            return text, []
        return _HERMES.sub("", text).strip(), calls
    if fmt is ToolFormat.HARMONY:  # `text` is the raw reply; the content comes from the reasoning parser
        calls = [ParsedCall(m.group(1), m.group(2).strip(), call_id()) for m in _HARMONY.finditer(text)]
        if any(_loads(c.arguments) is None for c in calls):
            return text, []
        return "", calls
    if fmt is ToolFormat.MISTRAL:
        head, sep, tail = text.partition("[TOOL_CALLS]")
        items = _loads(tail.strip()) if sep else None
        if isinstance(items, dict):
            items = [items]
        calls = [_call(o, "arguments") for o in items] if isinstance(items, list) else []
        if not calls or any(c is None for c in calls):
            return text, []
        return head.strip(), calls
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return text, []
    parts = [_loads(p) for p in body.split(";")] if _loads(body) is None else [_loads(body)]
    calls = [_call(o, "parameters") for o in parts]
    if not calls or any(c is None for c in calls):
        return text, []
    return "", calls


def may_start_call(fmt: ToolFormat, text: str) -> int:
    """Where in streamed `text` a tool call may begin (len(text) if nowhere): text before that
    is content for sure; from there on it is held back until the reply ends."""
    if fmt is ToolFormat.HARMONY:  # the call never reaches the content (the reasoning parser skips it)
        return len(text)
    marker = {ToolFormat.HERMES: "<tool_call>", ToolFormat.MISTRAL: "[TOOL_CALLS]"}.get(fmt)
    if marker is None:  # Llama 3: a call is the whole reply
        stripped = text.lstrip()
        if not stripped:
            return len(text)
        return 0 if stripped[0] in "{<" else len(text)
    at = text.find(marker)
    if at >= 0:
        return at
    for k in range(min(len(marker) - 1, len(text)), 0, -1):  # a marker cut by the stream
        if marker.startswith(text[-k:]):
            return len(text) - k
    return len(text)
