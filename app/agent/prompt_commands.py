"""MCP prompts as `/name` commands in the message box, and MCP resources attached to a message.

`/review topic=the plan` or `/review the plan` (the words fill the prompt's arguments in order, the
last taking the rest) runs the server's prompt and sends its messages in place of the typed line, as
Claude Desktop's prompt picker does. A resource is read once and goes into the user's message as a
fenced block that names its URI, so the model sees where the text came from.
"""
from __future__ import annotations

import shlex

from app.agent.mcp_connection import PromptInfo


class PromptCommandError(ValueError):
    """The command names a prompt but its arguments do not fit; the message says how to call it."""


def usage(prompt: PromptInfo) -> str:
    args = " ".join(f"{n}=…" if required else f"[{n}=…]" for n, required in prompt.arguments)
    return f"/{prompt.name} {args}".strip()


def parse_command(text: str, prompts: list[PromptInfo]) -> tuple[PromptInfo, dict[str, str]] | None:
    """(the prompt, its arguments) for a message that is a `/name …` command; None for any other text
    (a message that starts with "/" but names no prompt is sent as it is)."""
    if not text.startswith("/") or text.startswith("//"):
        return None
    name, _, rest = text[1:].partition(" ")
    prompt = next((p for p in prompts if p.name == name.strip()), None)
    if prompt is None:
        return None
    names = [n for n, _ in prompt.arguments]
    try:
        words = shlex.split(rest)
    except ValueError:
        words = rest.split()
    values: dict[str, str] = {}
    if words and all("=" in w and w.split("=", 1)[0] in names for w in words):
        values = dict(w.split("=", 1) for w in words)
    elif words:
        if not names:
            raise PromptCommandError(f"/{prompt.name} takes no arguments")
        head, tail = words[:len(names) - 1], words[len(names) - 1:]
        values = dict(zip(names, [*head, " ".join(tail)]))
    missing = [n for n, required in prompt.arguments if required and not values.get(n)]
    if missing:
        raise PromptCommandError(f"/{prompt.name} needs {', '.join(missing)}: {usage(prompt)}")
    return prompt, values


def with_resource(text: str, uri: str, content: str) -> str:
    """The user's message with a resource's text attached below it."""
    fence = "```"
    while fence in content:
        fence += "`"
    return f"{text}\n\n[resource {uri}]\n{fence}\n{content}\n{fence}".lstrip()
