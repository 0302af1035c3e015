"""The tools one chat offers the model: names the model sees, the request's `tools`, and the check of a
call's arguments against the tool's JSON schema before any server sees them."""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from app.agent.mcp_connection import ToolInfo

# OpenAI's function names: letters, digits, _ and -, at most 64
_NAME_OK = re.compile(r"[^A-Za-z0-9_-]")


def _public(server: str, tool: str) -> str:
    return _NAME_OK.sub("_", f"{server}__{tool}")[:64]


@dataclass(frozen=True, slots=True)
class Toolbox:
    """name the model calls -> the tool. A name two servers share is prefixed by its server
    (`server__tool`) on both; a unique name stays as the server wrote it."""

    tools: dict[str, ToolInfo]

    @classmethod
    def of(cls, tools: Iterable[ToolInfo]) -> Toolbox:
        tools = list(tools)
        counts = Counter(t.name for t in tools)
        named = {}
        for t in tools:
            name = t.name if counts[t.name] == 1 and not _NAME_OK.search(t.name) else _public(t.server, t.name)
            named[name] = t
        return cls(named)

    def __bool__(self) -> bool:
        return bool(self.tools)

    def openai_tools(self) -> list[dict]:
        """The request's `tools`, in OpenAI's function form (the engine writes them into the template)."""
        return [{"type": "function", "function": {"name": name, "description": t.description,
                                                  "parameters": t.input_schema or {"type": "object"}}}
                for name, t in self.tools.items()]

    def find(self, name: str) -> ToolInfo | None:
        return self.tools.get(name)


def check_arguments(tool: ToolInfo, arguments: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the parsed arguments, None) or (None, why they are refused): not JSON, not an object, or against
    the tool's schema. The model gets the reason back and can try again; the server never sees them."""
    import jsonschema

    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as exc:
        return None, f"the arguments are not valid JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(value, dict):
        return None, "the arguments must be a JSON object"
    validator = jsonschema.validators.validator_for(tool.input_schema or {})
    try:
        errors = sorted(validator(tool.input_schema or {}).iter_errors(value), key=lambda e: list(e.path))
    except jsonschema.SchemaError as exc:
        return None, f"the tool's own schema is broken: {exc.message}"
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path)
        return None, f"invalid arguments{' at ' + where if where else ''}: {errors[0].message}"
    return value, None


def cut_result(text: str, limit_chars: int) -> tuple[str, bool]:
    """A result cut to `limit_chars` with a note saying so, so a huge output cannot overflow the context."""
    if len(text) <= limit_chars:
        return text, False
    keep = limit_chars
    for _ in range(2):  # the note counts against the limit too; its figure changes its own length
        note = f"\n[... cut: the result was {len(text):,} characters; the first {keep:,} are shown]"
        keep = max(0, limit_chars - len(note))
    return text[:keep] + note, True
