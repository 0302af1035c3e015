"""The grammar that forces a tool call (tool_choice required or named) in a model's own syntax;
the syntax itself, and the parsing of replies, is engine/model_files/tool_call_syntax.py.
A template that never mentions `tools` cannot show the model its tools: a 400, not a silent drop.
"""
from __future__ import annotations

import json

from engine.grammar import JSON_OPTIONS
from engine.model_files.tool_call_syntax import ToolFormat


def _call_schema(tool, args_key: str) -> dict:
    f = tool.function
    params = f.parameters if isinstance(f.parameters, dict) else {"type": "object"}
    return {"type": "object", "properties": {"name": {"const": f.name}, args_key: params},
            "required": ["name", args_key], "additionalProperties": False}


def forced_call_grammar(fmt: ToolFormat, tools: list, parallel: bool, special_id) -> str:
    """Lark text (llguidance's dialect, JSON schemas inline with %json) for a reply that is
    only tool calls of `tools` in the model's syntax; one call unless `parallel`.
    `special_id(text)` is the token id of a control token such as [TOOL_CALLS]."""
    args_key = "parameters" if fmt is ToolFormat.LLAMA3 else "arguments"
    schema = {"anyOf": [_call_schema(t, args_key) for t in tools], "x-guidance": JSON_OPTIONS}
    body = "%json " + json.dumps(schema)
    if fmt is ToolFormat.HERMES:
        many = ' ("\\n" call)*' if parallel else ""
        return f'start: call{many}\ncall: "<tool_call>\\n" body "\\n</tool_call>"\nbody: {body}\n'
    if fmt is ToolFormat.MISTRAL:
        array = {"type": "array", "items": schema, "minItems": 1, "x-guidance": JSON_OPTIONS}
        if not parallel:
            array["maxItems"] = 1
        return f"start: <[{special_id('[TOOL_CALLS]')}]> calls\ncalls: %json {json.dumps(array)}\n"
    many = ' (";" call)*' if parallel else ""
    return f"start: call{many}\ncall: {body}\n"
