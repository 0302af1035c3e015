"""A chat as a Markdown document (File → Export): a heading per message, a reasoning model's thinking
as a quote, and each tool call an agent ran with its arguments and result in fenced blocks, so a
result's text stays text in any Markdown viewer. Pure functions over the chat store's records."""
from __future__ import annotations

import json
import re
import time
from typing import Any

from app.agent.steps import ToolStep

_BACKTICKS = re.compile(r"`+")


def fenced(text: str, language: str = "") -> str:
    """`text` as a fenced code block whose fence is longer than any run of backticks inside it, so no
    line of the text can close it (CommonMark: a closing fence is at least as long as the opening)."""
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{text}\n{fence}"


def code_span(text: str) -> str:
    """`text` as an inline code span (shown as written), on one line."""
    text = " ".join(text.split())
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def step_title(step: ToolStep) -> str:
    """server · tool · status · 0.4 s"""
    parts = [step.server or "?", step.tool or step.name, step.status.value]
    if step.seconds is not None:
        parts.append(f"{step.seconds:.1f} s")
    return " · ".join(parts)


def pretty_arguments(step: ToolStep) -> str:
    """The arguments as indented JSON (the text as the model wrote it when it is not JSON)."""
    value = step.arguments_object()
    return value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)


def step_markdown(step: ToolStep) -> list[str]:
    note = " (cut to fit the context)" if step.truncated else ""
    return [f"**Tool call** {code_span(step_title(step))}", "Arguments:", fenced(pretty_arguments(step), "json"),
            f"Result{note}:", fenced(step.result)]


def chat_markdown(chat: Any, messages: list[Any], image_folder: str = "") -> str:
    """`chat` a history Chat, `messages` its Messages (app/history.py); each image is linked as
    `image_folder/<its file>` (a folder beside the export, or the store's own as a file URI)."""
    lines = [f"# {chat.title}", ""]
    meta = [f"Model: {chat.model}"] if chat.model else []
    meta.append("Created: " + time.strftime("%Y-%m-%d %H:%M", time.localtime(chat.created_at)))
    if system := chat.settings.get("system_prompt"):
        meta.append(f"System prompt: {system}")
    lines += ["_" + " · ".join(meta) + "_", ""]
    for m in messages:
        note = "" if m.status == "done" else f" _({m.status})_"
        lines += [f"## {m.role.capitalize()}{note}", ""]
        if m.reasoning:  # the thinking as a quote above the answer
            took = f" for {m.thought_s:.0f} s" if m.thought_s is not None else ""
            lines += [f"> _Thought{took}:_", ">"] + [f"> {line}".rstrip() for line in m.reasoning.splitlines()] + [""]
        if m.content.strip():
            lines += [m.content.rstrip(), ""]
        lines += [f"![{image_alt(ref.name)}](<{image_folder}/{ref.file_name}>)" for ref in m.images]
        lines += [""] if m.images else []
        for step in m.tool_steps:
            lines += [part for block in step_markdown(step) for part in (block, "")]
        lines += [f"> {notice}" for notice in m.notices] + ([""] if m.notices else [])
        lines += sources_markdown(m.sources)
    return "\n".join(lines)


def image_alt(name: str) -> str:
    """An image's file name as a link's alt text (brackets would end it early)."""
    return re.sub(r"[\[\]\\]", "", " ".join(name.split())) or "image"


def sources_markdown(sources: list[Any]) -> list[str]:
    """The passages a reply was given, numbered as its `[n]` cite them: file, location, and the text quoted."""
    if not sources:
        return []
    lines = ["**Sources**", ""]
    for s in sources:
        where = f" — {s.location}" if s.location else ""
        lines.append(f"{s.index}. {code_span(s.filename)}{where}" + (f" ({s.path})" if s.path else ""))
        lines += [f"   > {line}".rstrip() for line in s.text.strip().splitlines()[:6]]
    return lines + [""]
