"""How often the GUI asks the engine for its status: every second while something happens, less
often while a ready engine sits idle (the 1 Hz poll was most of the app's idle CPU), and each answer
stamped with when it was taken. Qt-free; EngineController runs the timer and the worker."""
from __future__ import annotations

import time

from app.client import EngineClient
from ui.resident_models import running, waits

POLL_INTERVAL_MS = 1000
# A ready engine with nothing to do is asked this many times less often: the 1 Hz poll was most of
# the app's idle CPU (GUI + engine ~1.4% of a core). A chat that sends wakes the poll at once.
IDLE_POLL_FACTOR = 5
WAKE_S = 3.0  # after a wake-up, stay on the short interval this long (the request may not be queued yet)


def engine_idle(status: dict) -> bool:
    """Ready, nothing running or waiting (for a turn or for memory) on any model, no model loading, and no
    decoding in the last few seconds (the engine's 5 s rate), so there is nothing new for the status bar to show."""
    return (status.get("status") == "ready" and not running(status) and not status.get("num_waiting")
            and not waits(status) and not status.get("generation_tok_s"))


def timed_status(client: EngineClient) -> dict:
    """`client.status()` plus when it was taken (runs on a worker thread)."""
    return {"polled_at": time.monotonic(), **client.status()}
