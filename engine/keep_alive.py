"""How long an idle model stays loaded, in Ollama's `keep_alive` forms.

Ollama reads a JSON number as seconds and a string as a Go duration (`time.ParseDuration`:
"5m", "1h30m", "10s", "300ms", "1.5h"); its OLLAMA_KEEP_ALIVE also takes a bare integer string
as seconds. Any negative value keeps the model loaded for good, and 0 unloads it as soon as it is
idle. Torch-free and Qt-free: the engine, the settings and their dialog share this one reading.
"""
from __future__ import annotations

import math
import re

# Go's units, seconds each (µ is U+00B5, μ U+03BC: Go takes both)
UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = r"(?:\d+\.?\d*|\.\d+)"
_PART = re.compile(rf"({_NUMBER})(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_DURATION = re.compile(rf"(?:{_PART.pattern})+")
_SECONDS = re.compile(rf"[-+]?{_NUMBER}")
FORMS = "a number of seconds or a duration such as 5m, 1h30m or 300ms (negative: forever; 0: unload when idle)"


def parse_keep_alive(value: str | int | float) -> float | None:
    """Seconds an idle model stays loaded; None: forever (a negative value); 0.0: unload as soon as idle.

    Raises ValueError naming the value when it is none of Ollama's forms (None included: a
    missing keep_alive means the caller's default, which is the caller's to apply)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"keep_alive {value!r} is not {FORMS}")
    if isinstance(value, str):
        seconds = _duration_seconds(value.strip())
        if seconds is None:
            raise ValueError(f"keep_alive {value!r} is not {FORMS}")
    else:
        seconds = float(value)
        if not math.isfinite(seconds):
            raise ValueError(f"keep_alive {value!r} is not {FORMS}")
    if seconds < 0:
        return None
    return seconds + 0.0  # -0.0 is 0.0


def _duration_seconds(text: str) -> float | None:
    """'1h30m' -> 5400.0, '300' -> 300.0, '-1m' -> -60.0; None when it is not a duration."""
    if _SECONDS.fullmatch(text):
        return float(text)
    sign, body = (-1.0, text[1:]) if text[:1] == "-" else (1.0, text[1:] if text[:1] == "+" else text)
    if not _DURATION.fullmatch(body):
        return None
    return sign * sum(float(n) * UNITS[unit] for n, unit in _PART.findall(body))
