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


# Models taught Hermes' syntax do not always keep to it: Qwen2.5-Coder answers a tools prompt with the
# call in a ```json fence, or as the bare object, more often than inside <tool_call>. llama.cpp's Hermes
# parser reads both; here only for a name among the request's tools, so an example in a code answer stays text.
_FENCE = re.compile(r"```(?:json|xml)?[ \t]*\n(.*?)\n?[ \t]*```", re.DOTALL)


def _named_calls(obj, names: frozenset[str]) -> list[ParsedCall] | None:
    items = obj if isinstance(obj, list) else [obj]
    calls = [_call(o, "arguments") for o in items]
    if not calls or any(c is None or c.name not in names for c in calls):
        return None
    return calls


def _loose_hermes(text: str, names: frozenset[str]) -> tuple[str, list[ParsedCall]]:
    stripped = text.strip()
    if stripped.startswith("{"):
        calls = _named_calls(_loads(stripped), names)
        return ("", calls) if calls else (text, [])
    found = [(m, _named_calls(_loads(m.group(1).strip()), names)) for m in _FENCE.finditer(text)]
    calls = [c for _, cs in found if cs for c in cs]
    if not calls:
        return text, []
    content = text
    for m, cs in reversed(found):
        if cs:
            content = content[:m.start()] + content[m.end():]
    return content.strip(), calls


def parse_tool_calls(fmt: ToolFormat, text: str, names: frozenset[str] = frozenset()) -> tuple[str, list[ParsedCall]]:
    """(the reply's plain content, its tool calls); text that does not parse stays content. `names`:
    the request's tools, for the loose Hermes forms (a fenced or bare call object)."""
    if fmt is ToolFormat.HERMES:
        calls = [_call(_loads(m.group(1)), "arguments") for m in _HERMES.finditer(text)]
        if not calls:
            return _loose_hermes(text, names) if names else (text, [])
        if any(c is None for c in calls):
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
    if fmt is ToolFormat.HERMES:
        at = _loose_start(text)
        if at < len(text):
            return at
    for k in range(min(len(marker) - 1, len(text)), 0, -1):  # a marker cut by the stream
        if marker.startswith(text[-k:]):
            return len(text) - k
    return len(text)


def _grows_into_call(rest: str) -> bool:
    """Whether `rest` (from a fence or a leading brace) is, or may still grow into, the start of a
    loose Hermes call: ```json / ```xml, a newline, then {"name" (whitespace allowed between)."""
    i = 0
    if rest.startswith("`"):
        if not "```".startswith(rest[:3]):
            return False
        if len(rest) <= 3:
            return True
        i = 3
        word = next((w for w in ("json", "xml") if rest[i:].startswith(w) or w.startswith(rest[i:])), "")
        i = min(len(rest), i + len(word))
        while i < len(rest) and rest[i] in " \t":
            i += 1
        if i == len(rest):
            return True
        if rest[i] != "\n":
            return False
    while i < len(rest) and rest[i].isspace():
        i += 1
    if i == len(rest):
        return True
    if rest[i] != "{":
        return False
    i += 1
    while i < len(rest) and rest[i].isspace():
        i += 1
    tail = rest[i:i + 6]
    return '"name"'.startswith(tail) if len(tail) < 6 else tail == '"name"'


# how far past a candidate start _grows_into_call looks: a window that ends in whitespace only holds
# the text back (it may still grow into a call), so a short window errs on the side of waiting
_LOOSE_WINDOW = 64


def _loose_start(text: str) -> int:
    """Where a loose Hermes call may begin in streamed `text` (len(text) if nowhere)."""
    lead = len(text) - len(text.lstrip())
    if lead < len(text) and text[lead] == "{" and _grows_into_call(text[lead:lead + _LOOSE_WINDOW]):
        return lead
    at = text.find("`")
    while at >= 0:
        if _grows_into_call(text[at:at + _LOOSE_WINDOW]):
            return at
        at = text.find("`", at + 1)
    return len(text)
