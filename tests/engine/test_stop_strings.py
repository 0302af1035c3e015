"""StopStringMatcher: stop strings split across deltas, held-back prefixes, OpenAI-style cuts."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.detokenizer import StopStringMatcher


def stream(stops, chunks):
    """Feed chunks until a match; returns (emitted text, matched, chunks consumed)."""
    m = StopStringMatcher(stops)
    out = []
    for n, c in enumerate(chunks, 1):
        text, matched = m.feed(c)
        out.append(text)
        if matched:
            return "".join(out), True, n
    out.append(m.flush())
    return "".join(out), False, len(chunks)


def reference(text: str, stops) -> tuple[str, bool]:
    """Cut before the stop string completed first (smallest end, longest on a tie)."""
    best = None
    for s in (s for s in stops if s):
        i = text.find(s)
        if i >= 0 and (best is None or (i + len(s), i) < (best[0] + best[1], best[0])):
            best = (i, len(s))
    return (text, False) if best is None else (text[:best[0]], True)


def test_stop_split_across_deltas_is_found_and_cut():
    assert stream(["\nUser:"], ["Hello", " there\nUs", "er: what", "ever"]) == ("Hello there", True, 3)


def test_possible_prefix_is_held_then_released():
    m = StopStringMatcher(["</s>"])
    assert m.feed("abc<") == ("abc", False)
    assert m.held == "<"
    assert m.feed("/") == ("", False)
    assert m.feed("x") == ("</x", False)  # "</x" cannot start "</s>" any more
    assert m.flush() == ""


def test_flush_returns_held_text_when_stream_ends():
    m = StopStringMatcher(["STOP"])
    assert m.feed("the end ST") == ("the end ", False)
    assert m.flush() == "ST"


def test_after_a_match_nothing_more_is_emitted():
    m = StopStringMatcher(["##"])
    assert m.feed("a##b") == ("a", True)
    assert m.matched == "##"
    assert m.feed("more") == ("", True)
    assert m.flush() == ""


def test_no_stops_passes_text_through():
    m = StopStringMatcher([])
    assert m.feed("anything") == ("anything", False)
    assert StopStringMatcher([""]).feed("x") == ("x", False)  # "" is no stop string


def test_first_completed_stop_wins_regardless_of_chunking():
    # "bc" completes before "abcd" does, so generation would stop there.
    assert stream(["abcd", "bc"], ["abcd"]) == ("a", True, 1)
    assert stream(["abcd", "bc"], ["a", "b", "c", "d"]) == ("a", True, 3)
    # Same end: the longer (earlier-starting) stop wins.
    assert stream(["cd", "abcd"], ["xabcd"])[0] == "x"


def test_unicode_stops():
    assert stream(["🛑"], ["go go 🛑 no"]) == ("go go ", True, 1)
    assert stream(["é!"], ["caf", "é", "!", "x"]) == ("caf", True, 3)


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="ab\ncd", max_size=40),
       stops=st.lists(st.text(alphabet="ab\nc", min_size=0, max_size=4), max_size=3),
       cuts=st.lists(st.integers(0, 40), max_size=8))
def test_any_chunking_matches_the_one_shot_reference(text, stops, cuts):
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    emitted, matched, _ = stream(stops, chunks)
    assert (emitted, matched) == reference(text, stops)


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="xy<", max_size=30), stop=st.text(alphabet="xy<", min_size=1, max_size=5))
def test_held_text_is_always_a_proper_prefix_of_a_stop(text, stop):
    m = StopStringMatcher([stop])
    for ch in text:
        m.feed(ch)
        if m.matched:
            break
        assert len(m.held) < len(stop) and stop.startswith(m.held)
