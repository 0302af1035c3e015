"""Prometheus text exposition (format 0.0.4), written by hand: counters, gauges, histograms.

No prometheus_client: its default registry is a module global, and what we need is ~100 lines.
One `Metrics` object per app; the engine thread and the handlers update it under a lock.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque

TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOK_S_BUCKETS = (1, 5, 10, 25, 50, 100, 200, 400, 800, 1600)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def _fmt(v: float) -> str:
    v = float(v)
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


def _labels(pairs: tuple[tuple[str, str], ...]) -> str:
    if not pairs:
        return ""
    esc = lambda s: str(s).replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in pairs) + "}"


class Counter:
    def __init__(self, name: str, help: str, lock: threading.Lock) -> None:
        self.name, self.help, self._lock = name, help, lock
        self._values: dict[tuple, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        return self._values.get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        for key, v in sorted(self._values.items()) or [((), 0.0)]:
            lines.append(f"{self.name}{_labels(key)} {_fmt(v)}")
        return lines


class Histogram:
    def __init__(self, name: str, help: str, buckets: tuple, lock: threading.Lock) -> None:
        self.name, self.help, self._lock = name, help, lock
        self.buckets = tuple(buckets) + (math.inf,)
        self._counts = [0] * len(self.buckets)
        self._sum = 0.0
        self._n = 0

    def observe(self, v: float) -> None:
        with self._lock:
            for i, b in enumerate(self.buckets):
                if v <= b:
                    self._counts[i] += 1
            self._sum += v
            self._n += 1

    @property
    def count(self) -> int:
        return self._n

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for b, c in zip(self.buckets, self._counts):  # counts are cumulative already
            lines.append(f'{self.name}_bucket{{le="{_fmt(b)}"}} {c}')
        lines += [f"{self.name}_sum {_fmt(self._sum)}", f"{self.name}_count {self._n}"]
        return lines


class RateMeter:
    """Tokens per second over the last `window` seconds (what the GUI's status bar shows).

    Events older than the window go on every add as well as every read: a server nobody polls
    for its rate (headless, no GUI) would otherwise keep one event per engine step forever."""

    def __init__(self, window: float = 5.0) -> None:
        self.window = window
        self._events: deque[tuple[float, int]] = deque()

    def add(self, n: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._events.append((now, n))
        self._expire(now)

    def _expire(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self.window:
            self._events.popleft()

    def rate(self, now: float | None = None) -> float:
        self._expire(time.monotonic() if now is None else now)
        return sum(n for _, n in self._events) / self.window


class Metrics:
    def __init__(self) -> None:
        lock = self._lock = threading.Lock()
        p = "ember_"
        self.requests = Counter(p + "requests_total", "HTTP requests by endpoint and status.", lock)
        self.prompt_tokens = Counter(p + "prompt_tokens_total", "Prompt tokens admitted.", lock)
        self.generation_tokens = Counter(p + "generation_tokens_total", "Tokens generated.", lock)
        self.cached_tokens = Counter(p + "prompt_cached_tokens_total", "Prompt tokens served from the prefix cache.", lock)
        self.aborts = Counter(p + "request_aborts_total", "Requests aborted (client disconnects).", lock)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Time from request to first token.", TTFT_BUCKETS, lock)
        self.tok_s = Histogram(p + "request_tokens_per_second", "Decode rate of each finished request.", TOK_S_BUCKETS, lock)
        self.batch = Histogram(p + "batch_size", "Requests that progressed in one engine step.", BATCH_BUCKETS, lock)
        self.step_seconds = Counter(p + "engine_step_seconds_total", "Time spent in engine steps.", lock)
        self.generation_rate = RateMeter()

    # the engine thread, once per step
    def on_step(self, batch_size: int, new_tokens: int, seconds: float) -> None:
        if batch_size:
            self.batch.observe(batch_size)
        self.generation_tokens.inc(new_tokens)
        self.step_seconds.inc(seconds)
        with self._lock:
            self.generation_rate.add(new_tokens)

    def generation_tok_s(self) -> float:
        with self._lock:
            return self.generation_rate.rate()

    def render(self, stats=None, state: str = "unloaded") -> str:
        """All series; `stats` is the engine's EngineStats snapshot (None when no model)."""
        with self._lock:
            lines: list[str] = []
            for m in (self.requests, self.prompt_tokens, self.generation_tokens, self.cached_tokens,
                      self.aborts, self.step_seconds, self.ttft, self.tok_s, self.batch):
                lines += m.render()
        gauges = {
            "model_loaded": ("1 when a model is loaded and ready.", 1.0 if state == "ready" else 0.0),
            "generation_tokens_per_second": ("Aggregate decode rate over the last 5 s.", self.generation_tok_s()),
        }
        if stats is not None:
            total = max(stats.kv_blocks_total, 1)
            gauges.update({
                "kv_blocks_used": ("KV blocks in use.", stats.kv_blocks_used),
                "kv_blocks_total": ("KV blocks in the pool.", stats.kv_blocks_total),
                "kv_usage_ratio": ("Fraction of KV blocks in use.", stats.kv_blocks_used / total),
                "kv_cached_tokens": ("Tokens held by the prefix cache.", stats.cached_tokens),
                "prefix_cache_hit_rate": ("Prompt tokens served from the prefix cache / all.", stats.prefix_hit_rate),
                "requests_running": ("Sequences in the running queue.", stats.num_running),
                "requests_waiting": ("Sequences waiting for KV blocks or budget.", stats.num_waiting),
            })
            spec = stats.spec
            if spec is not None:
                gauges.update({
                    "speculative_draft_tokens": ("Draft tokens verified since start.", spec.num_proposed),
                    "speculative_accepted_tokens": ("Draft tokens accepted since start.", spec.num_accepted),
                    "speculative_acceptance_rate": ("Draft tokens accepted / verified.", spec.acceptance_rate or 0.0),
                    "speculative_tokens_per_pass": ("Tokens emitted per verifying target pass.",
                                                    spec.tokens_per_pass or 0.0),
                    "speculative_draft_seconds": ("Seconds spent drafting since start.", spec.draft_seconds),
                    "speculative_verify_seconds": ("Seconds of steps that verified drafts.", spec.verify_seconds),
                })
        for name, (help, v) in gauges.items():
            lines += [f"# HELP ember_{name} {help}", f"# TYPE ember_{name} gauge", f"ember_{name} {_fmt(v)}"]
        return "\n".join(lines) + "\n"
