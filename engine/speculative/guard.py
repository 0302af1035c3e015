"""Whether drafting pays, judged by what the steps deliver rather than by the fitted cost model.

The cost model (goodput.py) ranks the candidate ks, but a fit can be wrong in ways no candidate
shows: a negative price for several rows made drafts at 4 chats look cheaper than they were, and
the engine drafted itself to 0.81x of plain decoding. So the engine also keeps score of the
realised rate, tokens emitted per second of step (its drafting included), for decode-only steps
of each batch size b, as two moving averages: steps that verified drafts, and plain steps.

    drafting pays at b  ⇔  rate_draft(b) ≥ (1 - margin) · rate_plain(b)

Both need samples: while drafting is on, one step in `explore_every` is forced plain; while it is
off, one step in `explore_every` drafts as the cost model would. Until both averages hold
`min_samples` steps the cost model decides alone. A change in the text (acceptance) or in the
machine (the CPU's memory rate) shows in the averages within a few dozen steps, and the engine
follows. The per-step rate is noisy; the averages weigh recent steps most (`weight`).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Rates:
    plain: float = 0.0
    plain_n: int = 0
    draft: float = 0.0
    draft_n: int = 0


class DraftGuard:
    def __init__(self, explore_every: int = 16, min_samples: int = 4, margin: float = 0.03,
                 weight: float = 0.2) -> None:
        self.explore_every, self.min_samples, self.margin, self.weight = explore_every, min_samples, margin, weight
        self._rates: dict[int, _Rates] = {}
        self._steps = 0
        self.num_blocked = 0  # steps at which drafting was held back (for stats and tests)

    def pays(self, batch: int) -> bool | None:
        """True or False once both kinds of step have been measured at this batch size; None before."""
        r = self._rates.get(batch)
        if r is None or r.plain_n < self.min_samples or r.draft_n < self.min_samples:
            return None
        return r.draft >= (1.0 - self.margin) * r.plain

    def allow(self, batch: int) -> bool:
        """Whether this step may draft (the cost model still picks how much)."""
        self._steps += 1
        explore = self._steps % self.explore_every == 0
        verdict = self.pays(batch)
        if verdict is None:  # learning: the cost model decides, with a plain step now and then
            r = self._rates.get(batch)
            return not (explore or (r is not None and r.plain_n < self.min_samples and self._steps % 4 == 0))
        allowed = verdict != explore  # the other kind of step, one in explore_every
        self.num_blocked += not allowed
        return allowed

    def observe(self, batch: int, drafted: bool, tokens: int, seconds: float) -> None:
        """One decode-only step of `batch` sequences that emitted `tokens` in `seconds`."""
        if batch < 1 or seconds <= 0:
            return
        rate = tokens / seconds
        r = self._rates.setdefault(batch, _Rates())
        if drafted:
            r.draft = rate if not r.draft_n else r.draft + self.weight * (rate - r.draft)
            r.draft_n += 1
        else:
            r.plain = rate if not r.plain_n else r.plain + self.weight * (rate - r.plain)
            r.plain_n += 1

    def rates(self, batch: int) -> tuple[float, float] | None:
        """(plain, drafted) tokens per second at this batch size, once both were measured."""
        r = self._rates.get(batch)
        return (r.plain, r.draft) if r is not None and r.plain_n and r.draft_n else None
