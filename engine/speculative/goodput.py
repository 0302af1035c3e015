"""How many drafts pay: measured step costs, acceptance estimates, and the choice of k. No torch.

With acceptance rate α per draft position (each position accepted given the ones before it),
a sequence given k drafts emits E(k) = 1 + α + α² + … + α^k tokens in one step. A step that
computes n tokens costs T(n), measured (the kernels share each weight's unpack across rows, so
T grows slowly with n while memory-bound, then linearly). Drafting depth k for b sequences
costs D(b, k) (0 for prompt lookup). The choice maximizes goodput for the batch,
    G(k_1..k_S) = Σ_s E_s(k_s) / (T(N + Σ_s k_s) + D(#drafting, max_s k_s)),
N the step's other tokens. Adding the i-th draft to sequence s adds α_s^i tokens, which falls
with i, so increments are taken best-first and the best prefix is kept (the optimum when
drafting is free and T is convex; with a draft model's per-depth cost, a close greedy). k = 0
everywhere (plain decoding) is one of the candidates, so speculation is chosen only where the
measured costs say it pays.
"""
from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable


class StepCosts:
    """Seconds a forward of n tokens takes: an average per n (EWMA, recent steps weigh most),
    read between measured sizes by linear interpolation."""

    def __init__(self, weight: float = 0.2) -> None:
        self.weight = weight
        self._sizes: list[int] = []  # sorted
        self._secs: dict[int, float] = {}

    def observe(self, n: int, seconds: float) -> None:
        if n < 1 or seconds <= 0:
            return
        old = self._secs.get(n)
        if old is None:
            bisect.insort(self._sizes, n)
            self._secs[n] = seconds
        else:
            self._secs[n] = old + self.weight * (seconds - old)

    @property
    def empty(self) -> bool:
        return not self._sizes

    def __call__(self, n: int) -> float:
        """T(n); 0 before any measurement. Past the largest measured size: proportional to n
        (compute-bound, the pessimistic end)."""
        sizes = self._sizes
        if not sizes:
            return 0.0
        i = bisect.bisect_left(sizes, n)
        if i < len(sizes) and sizes[i] == n:
            return self._secs[n]
        if i == 0:
            return self._secs[sizes[0]]  # costs do not shrink below the smallest measured
        if i == len(sizes):
            top = sizes[-1]
            return self._secs[top] * n / top
        lo, hi = sizes[i - 1], sizes[i]
        t_lo, t_hi = self._secs[lo], self._secs[hi]
        return t_lo + (t_hi - t_lo) * (n - lo) / (hi - lo)


class Acceptance:
    """Per-sequence acceptance α with an engine-wide prior: α_s = (a_s + m·α) / (t_s + m), a/t the
    accepted/tried draft positions (a position is tried when every draft before it was accepted);
    counts decay so a sequence whose text changes character is re-estimated."""

    def __init__(self, prior: float = 0.5, strength: float = 2.0, decay: float = 0.98) -> None:
        self.strength, self.decay = strength, decay
        self.accepted, self.tried = prior * 4, 4.0  # engine-wide, a weak start at `prior`
        self._seq: dict[int, list[float]] = {}

    @property
    def rate(self) -> float:
        return self.accepted / self.tried

    def observe(self, seq_id: int, tried: int, accepted: int) -> None:
        if tried <= 0:
            return
        a_t = self._seq.setdefault(seq_id, [0.0, 0.0])
        a_t[0] = a_t[0] * self.decay + accepted
        a_t[1] = a_t[1] * self.decay + tried
        self.accepted = self.accepted * 0.999 + accepted
        self.tried = self.tried * 0.999 + tried

    def of(self, seq_id: int) -> float:
        a, t = self._seq.get(seq_id, (0.0, 0.0))
        return min((a + self.strength * self.rate) / (t + self.strength), 0.99)

    def release(self, seq_id: int) -> None:
        self._seq.pop(seq_id, None)


def choose_ks(alphas: list[float], available: list[int], base_tokens: int,
              step_cost: Callable[[int], float], draft_cost: Callable[[int, int], float]) -> list[int]:
    """The k per sequence that maximizes G (module docstring). `draft_cost(num_drafting, depth)`."""
    n = len(alphas)
    ks = [0] * n
    best, best_ks = n / max(step_cost(base_tokens), 1e-9), list(ks)
    heap = [(-a, i) for i, (a, m) in enumerate(zip(alphas, available)) if m > 0 and a > 0]
    heapq.heapify(heap)
    tokens, extra, drafting, depth = float(n), 0, 0, 0
    while heap:
        neg_gain, i = heapq.heappop(heap)
        drafting += ks[i] == 0
        ks[i] += 1
        extra += 1
        depth = max(depth, ks[i])
        tokens -= neg_gain
        g = tokens / max(step_cost(base_tokens + extra) + draft_cost(drafting, depth), 1e-9)
        if g > best:
            best, best_ks = g, list(ks)
        if ks[i] < available[i]:
            heapq.heappush(heap, (neg_gain * alphas[i], i))
    return best_ks
