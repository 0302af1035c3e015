"""Sections into chunks by their structure: Markdown by headings, code by top-level definitions,
prose by paragraphs; no chunk crosses a page or a slide, so its location stays exact.

A chunk is at most `max_chars` characters (about a quarter as many tokens of English: 1,000
characters is ~250 tokens, inside the 256 all-MiniLM-L6-v2 was trained on). Paragraphs (or a
definition's lines) are packed greedily up to that size; one larger than it is cut at sentence
ends, then at spaces. A chunk after the first of a Markdown section starts with its heading trail,
so a passage keeps the words that say what it is about (what BM25 and the embedder then see).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from engine.docs.convert import Section

MAX_CHARS = 1000
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
# a top-level definition in the common languages: where a code file is split
_DEFINITION = re.compile(r"^(?:async\s+def|def|class|fn|pub\s|func|function|export\s|interface|struct|impl|enum|"
                         r"type\s|module|package|public\s|private\s|protected\s|static\s|const\s|let\s|var\s|@)")
_SENTENCE = re.compile(r"(?<=[.!?。])\s+")


@dataclass(frozen=True, slots=True)
class Chunk:
    text: str
    location: str  # "page 3", "Install > Linux", "lines 10-42", "slide 2 · Title"


def chunk_sections(kind: str, sections: list[Section], max_chars: int = MAX_CHARS) -> list[Chunk]:
    out: list[Chunk] = []
    for s in sections:
        if kind == "code":
            out += _code(s.text, max_chars)
        elif kind == "markdown":
            out += _markdown(s, max_chars)
        else:
            out += [Chunk(t, s.location) for t in pack(_paragraphs(s.text), max_chars)]
    return [c for c in out if c.text.strip()]


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


def split_long(text: str, max_chars: int) -> list[str]:
    """Pieces of at most max_chars: at sentence ends where they fall, else at the last space."""
    if len(text) <= max_chars:
        return [text]
    pieces: list[str] = []
    for sentence in _SENTENCE.split(text):
        while len(sentence) > max_chars:
            cut = sentence.rfind(" ", 0, max_chars)
            cut = cut if cut > max_chars // 2 else max_chars
            pieces.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        pieces.append(sentence)
    return pack(pieces, max_chars, sep=" ")


def pack(parts: list[str], max_chars: int, sep: str = "\n\n") -> list[str]:
    """Greedy packing of parts, in order, into texts of at most max_chars."""
    out: list[str] = []
    cur = ""
    for p in parts:
        for piece in split_long(p, max_chars) if len(p) > max_chars else [p]:
            if cur and len(cur) + len(sep) + len(piece) > max_chars:
                out.append(cur)
                cur = ""
            cur = f"{cur}{sep}{piece}" if cur else piece
    if cur:
        out.append(cur)
    return out


def _markdown(section: Section, max_chars: int) -> list[Chunk]:
    trail: list[str] = []
    blocks: list[tuple[str, list[str]]] = [("", [])]  # (heading trail, lines)
    fence = False
    for line in section.text.splitlines():
        fence ^= line.lstrip().startswith("```")
        m = None if fence else _HEADING.match(line)
        if m:
            level = len(m.group(1))
            trail = trail[:level - 1] + [""] * (level - 1 - len(trail)) + [m.group(2)]
            blocks.append((" > ".join(t for t in trail if t), []))
        blocks[-1][1].append(line)
    out = []
    for heading, lines in blocks:
        where = " · ".join(x for x in (section.location, heading) if x)
        for i, text in enumerate(pack(_paragraphs("\n".join(lines)), max_chars - len(heading) - 2)):
            out.append(Chunk(f"{heading}\n\n{text}" if i and heading else text, where))
    return out


def _code(text: str, max_chars: int) -> list[Chunk]:
    """Blocks that start at a top-level definition, packed up to max_chars; 'lines a-b' each."""
    lines = text.splitlines()
    starts = [0] + [i for i, line in enumerate(lines) if i and _DEFINITION.match(line)
                    and not lines[i - 1].startswith("@")]
    blocks = [(a, b) for a, b in zip(starts, starts[1:] + [len(lines)]) if a < b]
    out, first, cur = [], 0, ""
    for a, b in blocks:
        for start, body in _line_runs(lines, a, b, max_chars):
            if cur and len(cur) + 1 + len(body) > max_chars:
                out.append(Chunk(cur, f"lines {first + 1}-{start}"))
                cur = ""
            if not cur:
                first = start
            cur = f"{cur}\n{body}" if cur else body
    if cur:
        out.append(Chunk(cur, f"lines {first + 1}-{len(lines)}"))
    return out


def _line_runs(lines: list[str], a: int, b: int, max_chars: int) -> list[tuple[int, str]]:
    """Lines a..b as (first line, text) runs of at most max_chars (a line longer than that is cut)."""
    runs, start, cur = [], a, []
    size = 0
    for i in range(a, b):
        line = lines[i][:max_chars]
        if cur and size + len(line) + 1 > max_chars:
            runs.append((start, "\n".join(cur)))
            start, cur, size = i, [], 0
        cur.append(line)
        size += len(line) + 1
    if cur:
        runs.append((start, "\n".join(cur)))
    return runs
