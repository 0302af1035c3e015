"""How many drafts pay: measured step costs, acceptance estimates, and the choice of k. No torch.

With acceptance rate α per draft position (each position accepted given the ones before it),
a sequence given k drafts emits E(k) = 1 + α + α² + … + α^k tokens in one step. A step costs
T(n, A), n the tokens it computes and A the keys their rows attend (Σ over rows of the row's
context: every row, a draft's too, attends on its own), fitted to the measured steps
(`StepCostModel`): the weights' cost grows slowly with n while memory-bound (the kernels share
each weight's unpack across rows), attention grows with A, so a draft on a long context costs
more than one on a short. Drafting depth k for b sequences costs D(b, k) (0 for prompt lookup).
The choice maximizes goodput for the batch,
    G(k_1..k_S) = Σ_s E_s(k_s) / (T(N + Σ_s k_s, A + Σ_s Σ_j (L_s + j)) + D(#drafting, max_s k_s)),
N and A the step's other tokens and keys, L_s sequence s's length. Adding the i-th draft to sequence s adds α_s^i tokens, which falls
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


class StepCostModel:
    """T(n, A) ≈ a + b·n + c·A/1024 + e·[n > 1]: least squares over the measured steps, recent
    ones weighing most (each older step's weight decays by `forget`). [n > 1] is the step from one
    row (the kernels' single-row path) to several. A small ridge keeps the fit defined before the
    steps vary; until then drafts look cheap, so they are tried and their cost measured.

    Only steps of at most `max_tokens` tokens are fitted: the choice is between n and n + k for
    decode-sized n, while a prompt chunk of hundreds of tokens is compute-bound and its cost is
    not a line through the decodes'. Fitted together, the chunks set b and e: on Qwen2.5-1.5B
    a step of several rows was priced 44 ms over one, or below it, depending on the chunks.
    A step with a chunk is then predicted too cheap, which makes its drafts look dearer than
    they are: the cautious side."""

    FEATURES = 4

    def __init__(self, forget: float = 0.98, ridge: float = 1e-6, max_tokens: int = 64) -> None:
        self.forget, self.ridge, self.max_tokens = forget, ridge, max_tokens
        self._xx = [[0.0] * self.FEATURES for _ in range(self.FEATURES)]
        self._xy = [0.0] * self.FEATURES
        self._coef: list[float] | None = None
        self.num_steps = 0

    @staticmethod
    def _x(n: int, attended: int) -> list[float]:
        return [1.0, float(n), attended / 1024.0, float(n > 1)]

    def observe(self, n: int, attended: int, seconds: float) -> None:
        if not 1 <= n <= self.max_tokens or seconds <= 0:
            return
        x, f = self._x(n, attended), self.forget
        for i in range(self.FEATURES):
            self._xy[i] = self._xy[i] * f + x[i] * seconds
            for j in range(self.FEATURES):
                self._xx[i][j] = self._xx[i][j] * f + x[i] * x[j]
        self._coef = None
        self.num_steps += 1

    @property
    def coef(self) -> list[float]:
        """(a, b, c, e) in seconds: a step, a token, 1024 attended keys, several rows. No CPU
        makes a token, a key or a second row cost less than nothing, so b, c and e are held at
        0 or above: a term the free fit makes negative is dropped and the rest refitted (the
        active-set least squares of a few terms). A negative e had priced a step of several rows
        below one of a single row, so drafts at 4 chats looked cheaper than they were."""
        if self._coef is None:
            active = list(range(self.FEATURES))
            while True:
                m = [[self._xx[i][j] + (self.ridge if i == j else 0.0) for j in active] + [self._xy[i]]
                     for i in active]
                sol = dict(zip(active, _solve(m)))
                negative = [i for i in active if i > 0 and sol[i] < 0]
                if not negative:
                    break
                active.remove(min(negative, key=lambda i: sol[i]))  # the most negative first
            self._coef = [sol.get(i, 0.0) for i in range(self.FEATURES)]
        return self._coef

    def __call__(self, n: int, attended: int) -> float:
        if not self.num_steps:
            return 0.0
        return max(sum(c * x for c, x in zip(self.coef, self._x(n, attended))), 0.0)


def _solve(m: list[list[float]]) -> list[float]:
    """Gaussian elimination with partial pivoting on an augmented [k, k+1] system."""
    k = len(m)
    for col in range(k):
        piv = max(range(col, k), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        if abs(m[col][col]) < 1e-300:
            continue
        for r in range(col + 1, k):
            f = m[r][col] / m[col][col]
            for c in range(col, k + 1):
                m[r][c] -= f * m[col][c]
    out = [0.0] * k
    for r in range(k - 1, -1, -1):
        if abs(m[r][r]) >= 1e-300:
            out[r] = (m[r][k] - sum(m[r][c] * out[c] for c in range(r + 1, k))) / m[r][r]
    return out


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


def choose_ks(alphas: list[float], available: list[int], lengths: list[int],
              step_cost: Callable[[int, int], float], draft_cost: Callable[[int, int], float]) -> list[int]:
    """The k per sequence that maximizes G (module docstring). `step_cost(extra_tokens,
    extra_keys)` is the step's cost with that much more than its other work; `lengths` the
    sequences' lengths (a draft j rows past it attends L + j keys); `draft_cost(num_drafting, depth)`."""
    n = len(alphas)
    ks = [0] * n
    base = max(step_cost(0, 0), 1e-9)
    best, best_ks = n / base, list(ks)
    heap = [(-a, i) for i, (a, m) in enumerate(zip(alphas, available)) if m > 0 and a > 0]
    heapq.heapify(heap)
    tokens, extra, keys, drafting, depth = float(n), 0, 0, 0, 0
    while heap:
        neg_gain, i = heapq.heappop(heap)
        drafting += ks[i] == 0
        ks[i] += 1
        extra += 1
        keys += lengths[i] + ks[i]
        depth = max(depth, ks[i])
        tokens -= neg_gain
        g = tokens / (max(step_cost(extra, keys), base) + draft_cost(drafting, depth))
        if g > best:
            best, best_ks = g, list(ks)
        if ks[i] < available[i]:
            heapq.heappush(heap, (neg_gain * alphas[i], i))
    return best_ks
