"""Ollama's `keep_alive` forms (its api.Duration and OLLAMA_KEEP_ALIVE, Go's time.ParseDuration):
a number is seconds, a string a Go duration, a negative value forever (None), 0 unload at once."""
from __future__ import annotations

import pytest

from engine.keep_alive import parse_keep_alive


@pytest.mark.parametrize("value,seconds", [
    ("5m", 300.0), ("1h30m", 5400.0), ("10s", 10.0), ("300ms", 0.3), ("1.5h", 5400.0), ("2h45m30.5s", 9930.5),
    (".5s", 0.5), ("5.s", 5.0), ("+5m", 300.0), ("1m30s", 90.0), ("1us", 1e-6), ("1\u00b5s", 1e-6), ("1\u03bcs", 1e-6),
    ("1000000ns", 1e-3), (" 5m ", 300.0),
    (300, 300.0), (1.5, 1.5), ("300", 300.0), ("30.5", 30.5),  # numbers: seconds (OLLAMA_KEEP_ALIVE=300)
    (0, 0.0), (0.0, 0.0), (-0.0, 0.0), ("0", 0.0), ("0s", 0.0), ("-0s", 0.0), ("0m0s", 0.0),  # unload when idle
    (-1, None), (-1.5, None), ("-1", None), ("-1m", None), ("-1h30m", None), ("-300ms", None),  # forever
])
def test_the_forms_ollama_accepts(value, seconds):
    got = parse_keep_alive(value)
    assert got == pytest.approx(seconds) if seconds is not None else got is None
    if seconds is not None:
        assert isinstance(got, float) and str(got) != "-0.0"


@pytest.mark.parametrize("value", ["", " ", "m", "5x", "5 m", "1h 30m", ".s", "5m-", "--1m", "five", "1.2.3s",
                                   "1d", "5M", "1e3s", None, True, False, float("nan"), float("inf"), [5], {"m": 5}])
def test_a_bad_value_is_refused_by_name(value):
    with pytest.raises(ValueError, match="keep_alive") as e:
        parse_keep_alive(value)
    assert repr(value) in str(e.value) and "5m" in str(e.value)
