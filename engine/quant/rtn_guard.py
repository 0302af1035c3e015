"""GPTQ never worse than RTN on held-out calibration rows, by construction (issue 69).

GPTQ minimises the output error on the tokens its Hessian saw; on other text it can lose to plain
rounding (too few tokens for the layer's width, a direction the calibration barely saw). So the
last samples of the calibration set are held out of every Hessian (`held_out`), and after GPTQ
quantizes a linear each output row r keeps GPTQ's codes only where its error on the held-out
inputs X_h, ||X_h (w_r - q_r)||^2, is at most RTN's for the same groups; elsewhere the row is
RTN's. Rows are independent (each has its own scales per group), so the choice per row is exact
and costs two matmuls. The errors are summed in a fixed order through exact_sums.fixed_matmul, so
the choice, like the rest of GPTQ, is the same on every CPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from engine.quant.exact_sums import fixed_matmul
from engine.weights.int_weight import IntWeight
from engine.weights.rtn import group_params, quantize_codes, rtn

HOLDOUT_FRACTION = 8  # one sample in 8 is held out (at least one, once there are two)


def held_out(num_samples: int) -> int:
    """How many of the last calibration samples no Hessian sees."""
    return 0 if num_samples < 2 else max(1, num_samples // HOLDOUT_FRACTION)


class Split:
    """A capture sink: the first `fit_rows` rows (the Hessian's samples) go to fit(x), the rest
    are kept as the held-out inputs."""

    def __init__(self, fit_rows: int, fit: Callable[[torch.Tensor], None]) -> None:
        self.fit_rows, self.fit, self.seen, self.rows = fit_rows, fit, 0, []

    def __call__(self, _name: str, x: torch.Tensor) -> None:
        cut = max(0, min(x.shape[0], self.fit_rows - self.seen))
        self.seen += x.shape[0]
        if cut:
            self.fit(x[:cut])
        if cut < x.shape[0]:
            self.rows.append(x[cut:])

    def held(self) -> torch.Tensor | None:
        return torch.cat(self.rows) if self.rows else None


@dataclass
class Tally:
    """Held-out squared output errors summed over the linears, and the rows kept each way."""

    chosen: float = 0.0  # of the weights written
    rtn: float = 0.0  # of RTN's weights for the same groups
    reference: float = 0.0  # ||X_h W^T||^2: the scale both are relative to
    rows_gptq: int = 0
    rows_rtn: int = 0

    def add(self, other: Tally) -> None:
        for k in ("chosen", "rtn", "reference", "rows_gptq", "rows_rtn"):
            setattr(self, k, getattr(self, k) + getattr(other, k))


def rtn_like(w: torch.Tensor, like: IntWeight, sym: bool) -> IntWeight:
    """RTN of w with the groups of `like` (its g_idx under act-order)."""
    if like.g_idx is None:
        return rtn(w, like.bits, like.group_size, sym)
    g = like.groups()
    scales = torch.empty_like(like.scales, dtype=torch.float64)
    zeros = torch.empty_like(scales)
    w = w.float()  # as rtn() works
    for k in range(like.n_groups):
        scales[:, k], zeros[:, k] = group_params(w[:, g == k], like.bits, sym)
    q = quantize_codes(w, scales[:, g], zeros[:, g], like.bits)
    return IntWeight(like.bits, like.group_size, q, scales.float(), zeros.to(torch.uint8), like.g_idx)


def row_errors(x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """float64 [N]: ||x d_r||^2 for every row d_r of d, summed in a fixed order (module docstring)."""
    e = fixed_matmul(x.double(), d.double().T)  # [T, N], the same bits everywhere
    total = torch.zeros(e.shape[1], dtype=torch.float64)
    for row in e * e:  # elementwise, token by token: no reduction whose order a kernel picks
        total += row
    return total


def keep_better(w: torch.Tensor, gptq: IntWeight, x_held: torch.Tensor, sym: bool) -> tuple[IntWeight, Tally]:
    """Each row GPTQ's codes where its held-out error is at most RTN's, else RTN's."""
    r = rtn_like(w, gptq, sym)
    w64 = w.double()
    err_g = row_errors(x_held, w64 - gptq.dequantize().double())
    err_r = row_errors(x_held, w64 - r.dequantize().double())
    use_rtn = err_g > err_r
    pick = lambda a, b: torch.where(use_rtn[:, None], a, b)  # noqa: E731
    out = IntWeight(gptq.bits, gptq.group_size, pick(r.q, gptq.q).contiguous(), pick(r.scales, gptq.scales),
                    pick(r.zeros, gptq.zeros), gptq.g_idx)
    chosen = torch.where(use_rtn, err_r, err_g)
    n_rtn = int(use_rtn.sum())
    tally = Tally(_fsum(chosen), _fsum(err_r), _fsum(row_errors(x_held, w64)), len(use_rtn) - n_rtn, n_rtn)
    return out, tally


def _fsum(t: torch.Tensor) -> float:
    return math.fsum(t.tolist())
