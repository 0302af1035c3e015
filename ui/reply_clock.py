"""A reply's timing as the client sees it: when it was sent, when its first token came, how many
tokens since; its time to first token and speed follow. Qt-free."""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class ReplyClock:
    t_sent: float = field(default_factory=time.monotonic)
    t_first: float = 0.0  # 0: nothing yet
    tokens: int = 0

    def token(self, now: float) -> None:
        """One more token (of thoughts or answer) arrived at `now`."""
        if not self.t_first:
            self.t_first = now
        self.tokens += 1

    def stats(self, server_tok_s: float | None = None) -> dict | None:
        """{"ttft_s", "tok_s", "tokens"} once a token came: the server's speed when it says one, else
        (tokens after the first) / (seconds since the first)."""
        if not self.t_first:
            return None
        elapsed = time.monotonic() - self.t_first
        tok_s = server_tok_s or ((self.tokens - 1) / elapsed if self.tokens > 1 and elapsed > 0 else 0.0)
        return {"ttft_s": self.t_first - self.t_sent, "tok_s": tok_s, "tokens": self.tokens}
