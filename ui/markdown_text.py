"""Any text as Markdown that shows it exactly as written (the transcript's user messages, names,
notices, a tool's server and name): nothing in it is read as Markdown or HTML."""
from __future__ import annotations

import re

_PUNCT = re.compile(r"[!-/:-@\[-`{-~]")  # every ASCII punctuation character


def verbatim(text: str) -> str:
    """Markdown that shows `text` exactly as typed: every ASCII punctuation mark backslash-escaped
    (CommonMark lets any of them be), each line a hard break, and leading spaces kept as no-break
    spaces (which toPlainText gives back as spaces), so that an indent never opens a code block."""
    lines = []
    for line in text.split("\n"):
        body = line.lstrip(" ")
        indent = "\u00a0" * (len(line) - len(body))
        lines.append(indent + _PUNCT.sub(r"\\\g<0>", body))
    return "\\\n".join(lines)  # a backslash at a line's end is a hard line break


def plain(text: str) -> str:
    """One line of any text (its line breaks and runs of spaces made single spaces), verbatim."""
    return verbatim(" ".join(text.split()))
