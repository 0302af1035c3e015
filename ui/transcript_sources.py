"""A documents reply's sources in the transcript: each `[n]` of the answer a link to its passage, and
the passages listed under the reply by file and location (each a link that opens it). Qt-free
Markdown, as ui/transcript_markdown.py writes the rest; the links are `ember:source/<message>/<n>`."""
from __future__ import annotations

from engine.docs.sources import citations
from ui.markdown_text import plain
from ui.transcript_message import TranscriptMessage

SOURCE_ACTION = "source"


def _source_link(i: int, n: int, text: str) -> str:
    return f"[{text}](ember:{SOURCE_ACTION}/{i}/{n})"


def with_citation_links(body: str, m: TranscriptMessage, i: int) -> str:
    """The answer with each citation of one of its sources (`[1]`, `[1, 2]`) made links to them."""
    numbers = {s.index for s in m.sources}
    groups: dict[tuple[int, int], list[int]] = {}
    for n, start, end in citations(body, max(numbers, default=0)):
        if n in numbers:
            groups.setdefault((start, end), []).append(n)
    for (start, end), ns in sorted(groups.items(), reverse=True):  # from the end: the offsets stay right
        body = body[:start] + "".join(_source_link(i, n, f"\\[{n}\\]") for n in ns) + body[end:]
    return body


def sources_lines(m: TranscriptMessage, i: int, actions: bool) -> list[str]:
    """"Sources" and one line per passage: its number, file and location (a link that opens it)."""
    if not m.sources:
        return []
    lines = []
    for s in m.sources:
        name = plain(s.label)
        lines.append(f"\\[{s.index}\\] " + (_source_link(i, s.index, name) if actions else name))
    return ["**Sources**", "\\\n".join(lines)]
