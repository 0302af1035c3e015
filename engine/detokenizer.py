"""Token ids -> text deltas for streaming, and stop strings that span token boundaries.

Both are per-request state machines, fed one step at a time by the engine thread.
"""
from __future__ import annotations

import codecs
from typing import Iterable, Protocol


class _PieceSource(Protocol):
    def token_bytes(self, token_id: int, special: bool = True) -> bytes: ...


class IncrementalDetokenizer:
    """Emits only complete UTF-8 text; a character split over tokens waits for its last byte.

    Tokens are byte strings (byte-level BPE pieces, SentencePiece <0xNN> byte fallbacks), so one
    emoji can take four tokens and one token can end in the middle of a character. Python's
    incremental UTF-8 decoder keeps an unfinished trailing sequence back and decodes the rest,
    which is exactly "never emit half a character"; with errors="replace" its output over all
    steps is the same as bytes.decode("utf-8", "replace") of the concatenation, i.e. what
    `Tokenizer.decode` returns. `flush()` ends the stream: dangling bytes become U+FFFD.
    """

    def __init__(self, tokenizer: _PieceSource, skip_special: bool = True) -> None:
        self._tokenizer = tokenizer
        # Control tokens (<|im_start|>, <|im_end|>) are not text: llama.cpp's server and vLLM
        # leave them out of completions by default; skip_special=False shows them.
        self._special = not skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.token_ids: list[int] = []
        self.text = ""  # everything emitted so far

    def add(self, token_id: int) -> str:
        """Feeds one token; returns the newly completed text (often "", never half a char)."""
        self.token_ids.append(token_id)
        delta = self._decoder.decode(self._tokenizer.token_bytes(token_id, special=self._special))
        self.text += delta
        return delta

    def flush(self) -> str:
        """Ends the stream: an unfinished character at the end becomes U+FFFD."""
        delta = self._decoder.decode(b"", final=True)
        self.text += delta
        return delta

    @property
    def has_pending_bytes(self) -> bool:
        return bool(self._decoder.getstate()[0])


class StopStringMatcher:
    """Finds stop strings in streamed text, even when one is split across deltas.

    Invariant: the held-back text is the longest suffix of what was fed that is a proper prefix
    of some stop string; everything before it is safe to emit because no stop string can start
    there any more (a stop starting earlier would have to fit entirely in the text seen, and it
    was searched for). On a match the text is cut just before the stop string that was completed
    first, as OpenAI and vLLM do; the stop string itself is not returned, nor anything after it.
    """

    def __init__(self, stops: Iterable[str]) -> None:
        self.stops: tuple[str, ...] = tuple(dict.fromkeys(s for s in stops if s))  # no "" stops
        self._max_hold = max((len(s) for s in self.stops), default=1) - 1
        self._held = ""
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit now, whether a stop string has matched)."""
        if self.matched is not None:
            return "", True
        if not self.stops:
            return text, False
        buf = self._held + text
        hit, which = _earliest(buf, self.stops)
        if hit >= 0:
            self._held = ""
            self.matched = which
            return buf[:hit], True
        keep = _longest_prefix_suffix(buf, self.stops, self._max_hold)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], False

    def flush(self) -> str:
        """The stream ended without a match: the held-back text was real text after all."""
        held, self._held = self._held, ""
        return "" if self.matched is not None else held

    @property
    def held(self) -> str:
        return self._held


def _earliest(buf: str, stops: tuple[str, ...]) -> tuple[int, str | None]:
    """Start of the stop string that is completed first in buf; (-1, None) if none.

    "Completed first" (smallest end index; on a tie the longer stop) is what generation sees
    when text arrives piece by piece, so the result does not depend on how text was chunked.
    """
    best_end, start, which = -1, -1, None
    for s in stops:
        i = buf.find(s)  # the first occurrence of s also ends first
        if i >= 0:
            end = i + len(s)
            if best_end < 0 or end < best_end or (end == best_end and i < start):
                best_end, start, which = end, i, s
    return start, which


def _longest_prefix_suffix(buf: str, stops: tuple[str, ...], max_len: int) -> int:
    """Length of the longest suffix of buf that is a proper prefix of some stop string."""
    for n in range(min(max_len, len(buf)), 0, -1):
        tail = buf[-n:]
        if any(s.startswith(tail) for s in stops):
            return n
    return 0
