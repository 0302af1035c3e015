"""The tool calls an agent ran for a reply, as Markdown blocks of the transcript. Qt-free.

Collapsed, a call is one line, itself the link that opens it: `▸ server · tool · status · 0.4 s`
(TranscriptView colours a failed call's line red). Opened, it shows the arguments as JSON (coloured
by pygments like any ```json block) and the result, its first lines only until "show all" is clicked.
Everything a server or a model wrote goes into fenced blocks or escaped text: never HTML, never Markdown.
"""
from __future__ import annotations

from app.agent.steps import CallStatus, ToolStep
from app.history_export import fenced, pretty_arguments, step_title
from ui.markdown_text import plain
from ui.transcript_message import TranscriptMessage

PREVIEW_CHARS, PREVIEW_LINES = 1500, 30  # an opened result shows this much until "show all"
STEP_ACTION, WHOLE_ACTION = "tool", "toolall"  # ember:tool/<message>/<step>, ember:toolall/<message>/<step>
RESULT_FENCE = "tool-result"  # a result's block: plain (no lexer has the name), its long lines wrapped


def title(step: ToolStep) -> str:
    """server · tool · status · 0.4 s, while it runs "running…"."""
    if step.status is CallStatus.RUNNING:
        doing = "waiting for approval" if step.extra.get("asking") else "running…"
        return f"{step.server or '?'} · {step.tool or step.name} · {doing}"
    return step_title(step)


def preview(text: str) -> tuple[str, bool]:
    """The first lines of a long result, and whether that is less than the whole."""
    lines = text.split("\n")
    short = "\n".join(lines[:PREVIEW_LINES])[:PREVIEW_CHARS]
    return short, short != text


def step_lines(m: TranscriptMessage, i: int, n: int, actions: bool) -> list[str]:
    step = m.steps[n]
    opened = n in m.opened or not actions
    head = plain(title(step))
    line = f"{'▾' if opened else '▸'} " + (f"[{head}](ember:{STEP_ACTION}/{i}/{n})" if actions else head)
    if not opened:
        return [line]
    out = [line, "_Arguments_", fenced(pretty_arguments(step), "json")]
    if step.status is CallStatus.RUNNING:
        return out
    whole = n in m.whole or not actions
    shown, cut = (step.result, False) if whole else preview(step.result)
    out += ["_Result_" + (" _(cut to fit the context)_" if step.truncated else ""),
            fenced(shown + ("\n…" if cut else ""), RESULT_FENCE)]
    if actions and (cut or n in m.whole):
        label = f"show all ({len(step.result):,} characters)" if cut else "show less"
        out.append(f"[{label}](ember:{WHOLE_ACTION}/{i}/{n})")
    return out


def steps_lines(m: TranscriptMessage, i: int, actions: bool) -> list[str]:
    """Every call the agent ran (or runs) for the reply."""
    return [line for n in range(len(m.steps)) for line in step_lines(m, i, n, actions)]


def notice_lines(m: TranscriptMessage) -> list[str]:
    return [f"> ⚠ {plain(notice)}" for notice in m.notices]
