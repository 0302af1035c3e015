"""The passages a documents reply was given (the engine's `sources` extension of chat completions):
parsed from the wire, kept with the message in the chat history, and named in words. Qt-free."""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

_PAGE = re.compile(r"\bpage (\d+)")


@dataclass(frozen=True, slots=True)
class Source:
    """Passage `index` (the `[n]` the answer cites): its file, where in it, and its text."""

    index: int
    file_id: str
    filename: str
    location: str = ""  # "page 3", "slide 2", "Compost" (a heading); "" for the whole file
    text: str = ""
    score: float | None = None
    vector_store_id: str = ""
    path: str = ""  # the local file it came from, when the window uploaded it (its attributes' "path")

    @property
    def label(self) -> str:
        return f"{self.filename}, {self.location}" if self.location else self.filename

    @property
    def page(self) -> int | None:
        """The PDF page the passage is on (1-based), when its location names one."""
        m = _PAGE.search(self.location or "")
        return int(m.group(1)) if m else None


def parse_sources(raw: Any) -> tuple[Source, ...]:
    """The wire's (or the history's) list of source objects; malformed entries are skipped."""
    out = []
    for i, s in enumerate(raw if isinstance(raw, list) else (), 1):
        if not isinstance(s, dict):
            continue
        try:
            score = s.get("score")
            out.append(Source(int(s.get("index", i)), str(s.get("file_id") or ""), str(s.get("filename") or "?"),
                              str(s.get("location") or ""), str(s.get("text") or ""),
                              None if score is None else float(score), str(s.get("vector_store_id") or ""),
                              str(s.get("path") or (s.get("attributes") or {}).get("path") or "")))
        except (TypeError, ValueError):
            continue
    return tuple(out)


def sources_json(sources: list[Source] | tuple[Source, ...] | None) -> str | None:
    return None if sources is None else json.dumps([asdict(s) for s in sources], ensure_ascii=False)


def sources_from_json(text: str | None) -> list[Source]:
    try:
        return list(parse_sources(json.loads(text or "[]")))
    except ValueError:
        return []
