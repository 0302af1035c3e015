"""A chat as one Markdown document: a heading per turn, code blocks with a "Copy code" link, a line of
actions under each message (copy, edit & resend, earlier replies), tool calls (the server's parsed
calls, which reach the window as data: TranscriptMessage.tool_calls) as a collapsed line per call
that opens to the arguments as JSON, and a reasoning model's thinking above its answer. Pure
functions, Qt-free; TranscriptView renders what `to_markdown` writes.

The actions are links of the form `ember:<action>/<message index>[/<code block>]`.
"""
from __future__ import annotations

import json
import re

from app.history_export import code_span, fenced, image_alt
from ui.markdown_text import verbatim
from ui.transcript_message import TranscriptMessage
from ui.transcript_sources import sources_lines, with_citation_links
from ui.transcript_steps import notice_lines, steps_lines

ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "System"}
ACTION_SCHEME = "ember"
IMAGE_SCHEME = "ember-image"  # a message's own picture, `ember-image:<sha256>` (TranscriptView draws it)
FENCE = re.compile(r"^\s*```")


def _link(action: str, index: int, text: str, block: int | None = None) -> str:
    target = f"{ACTION_SCHEME}:{action}/{index}" + (f"/{block}" if block is not None else "")
    return f"[{text}]({target})"


def _with_code_links(body: str, index: int) -> str:
    """A "Copy code" link after each closed fenced block."""
    out, inside, n = [], False, 0
    for line in body.split("\n"):
        out.append(line)
        if FENCE.match(line):
            inside = not inside
            if not inside:
                out += ["", _link("code", index, "Copy code", n), ""]
                n += 1
    return "\n".join(out)


def _written_by(m: TranscriptMessage, i: int, names: dict[str, str]) -> str:
    """The model that wrote a reply, by name; its speed when the pointer rests on it (the link's title)."""
    figures = [f"{m.tok_s:.1f} tok/s" if m.tok_s else "", f"first token {1000 * m.ttft:.0f} ms" if m.ttft else ""]
    title = " · ".join(f for f in figures if f) or m.model
    return f'[{verbatim(names.get(m.model, m.model))}]({ACTION_SCHEME}:model/{i} "{title}")'


def _actions(m: TranscriptMessage, i: int, names: dict[str, str], last: bool) -> str:
    links = [_link("copy", i, "Copy" if m.content else "Copy thoughts")] if m.content or m.reasoning else []
    if m.role == "user":
        links.append(_link("edit", i, "Edit & resend"))
    if m.out_of_budget and last:
        links.append(_link("continue", i, "Continue"))
    links.append(_link("delete", i, "Delete"))
    if m.role == "assistant" and m.model:
        links.append(_written_by(m, i, names))
    if len(m.versions) > 1:
        links.append(f"{_link('prev', i, '‹')} reply {m.shown + 1} of {len(m.versions)} {_link('next', i, '›')}")
    return " · ".join(links)


def _brief(arguments: str, limit: int = 60) -> str:
    """`city="Paris", unit="celsius"`, cut to `limit` characters."""
    try:
        args = json.loads(arguments)
    except ValueError:
        args = None
    text = (", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
            if isinstance(args, dict) else arguments)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tool_call_lines(m: TranscriptMessage, i: int, actions: bool) -> list[str]:
    """The calls the server parsed that no agent ran (or not yet): a brief line each, opened to the JSON."""
    out = []
    for n, (name, arguments) in enumerate(m.tool_calls):
        if n < len(m.steps):  # drawn as its step
            continue
        opened = n in m.opened or not actions
        toggle = _link("tool", i, "hide arguments" if opened else "arguments", n) if actions else ""
        call = code_span(f"{name}({_brief(arguments)})")
        out.append(f"{'▾' if opened else '▸'} **Tool call** {call} {toggle}".rstrip())
        if opened:
            try:
                pretty = json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
            except ValueError:
                pretty = arguments
            out.append(fenced(pretty, "json"))
    return out


def _thinking_lines(m: TranscriptMessage, i: int, actions: bool) -> list[str]:
    """While it thinks, the thoughts as they stream; once the answer begins, one line to open them."""
    quoted = "\n".join(f"> {line}" for line in m.reasoning.strip().splitlines()) or "> …"
    if m.status == "streaming" and m.thought_s is None:
        return ["▾ _Thinking…_", quoted]
    took = f"Thought for {m.thought_s:.0f} s" if m.thought_s is not None else "Thoughts"
    opened = m.show_thinking or not actions
    toggle = _link("think", i, "hide" if opened else "show") if actions else ""
    return [f"{'▾' if opened else '▸'} _{took}_ {toggle}".rstrip()] + ([quoted] if opened else [])


def to_markdown(messages: list[TranscriptMessage], actions: bool = False, names: dict[str, str] | None = None,
                notice: str = "") -> str:
    """The transcript as one Markdown document: a heading per turn, the text as the model wrote it;
    `names` gives the models' names by id (a reply's model is shown by name); `notice`, a line above
    the chat (what kind of model answers it)."""
    parts: list[str] = [f"> ℹ {verbatim(notice)}"] if notice else []
    for i, m in enumerate(messages):
        if m.role == "system":
            continue
        title = ROLE_TITLES.get(m.role, m.role.title())
        body, calls = m.content, m.tool_calls or m.steps
        thinking = _thinking_lines(m, i, actions) if m.reasoning else []
        if m.status == "streaming":
            body = (body + " ▍") if body else ("" if thinking else f"_{verbatim(m.pending or 'Reading the chat…')}_")
        if _open_fence(body):  # an unfinished code block must not swallow what follows
            body += "\n```"
        if actions and m.status != "streaming":
            body = _with_code_links(body, i)
        if actions and m.sources:
            body = with_citation_links(body, m, i)
        if thinking:
            parts += [f"#### {title}", *thinking]
            if body.strip():
                parts.append(body)
        else:
            parts.append(f"#### {title}\n\n{body}" if body.strip() or not calls else f"#### {title}")
        parts += [" ".join(f"![{image_alt(r.name)}]({IMAGE_SCHEME}:{r.sha256})" for r in m.images)] if m.images else []
        parts += steps_lines(m, i, actions) + _tool_call_lines(m, i, actions) + notice_lines(m)
        parts += sources_lines(m, i, actions)
        if m.out_of_budget:
            parts.append("_The model used its whole token budget thinking and wrote no answer: "
                         "Continue lets it go on, or raise Max tokens in the chat's settings._")
        if m.status == "stopped":
            parts.append("_(stopped)_")
        elif m.status == "error":
            parts.append(f"> **⚠ Error:** {verbatim(m.error or 'the reply failed')}")
        if actions and m.status != "streaming" and (m.content or m.reasoning or m.images):
            parts.append(_actions(m, i, names or {}, i == len(messages) - 1))
    return "\n\n".join(parts) + "\n"


def _open_fence(text: str) -> bool:
    return sum(1 for line in text.splitlines() if line.lstrip().startswith("```")) % 2 == 1
