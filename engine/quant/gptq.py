"""GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers"; IST-DASLab/gptq gptq.py, AutoGPTQ quantization/gptq.py).

Each row w of W minimises the layer's output error 1/2 (w - q)^T H (w - q), H = 2/n sum_t x_t x_t^T.
Columns are quantized one at a time; after column i is rounded to q_i the not-yet-quantized
columns F absorb its error optimally (the OBS step):
    e = (w_i - q_i) / [H_F^-1]_ii,    w_F -= e [H_F^-1]_i,F,    loss += (w_i - q_i)^2 / (2 [H_F^-1]_ii)
With U the upper Cholesky factor of H^-1, row i of U is [H_F^-1]_i,F / sqrt([H_F^-1]_ii) for
F = {i, i+1, ...}, so every step reads one row of U (d = U_ii) and no inverse is ever updated.
Lazy batches: inside a block of B columns only the block is updated; the rest of W gets the
block's errors in one matmul at the end (W[:, i2:] -= E U[i1:i2, i2:]), the same result.

Group parameters are computed when a group starts, from the group's current (already updated)
values. The reference reads them from W, which misses the pending updates of the current block
when the group starts inside it; here those are applied first, so the result does not depend on
block_size (tested).

The same bytes on every CPU (issue 69): every step whose result decides a rounding is either
elementwise (one IEEE rounding per value, the same at any vector width) or a sum made exact
(engine/quant/exact_sums.py): the Hessian from float32 inputs put on 21-bit grids per block of
2048 tokens, the blocks added in order; the error feedback's matmuls on grids whose products
sum exactly; the damping's mean by math.fsum (correctly rounded, so order-free); the Cholesky
and triangular inverse our own, blocked in a fixed order on the same exact sums
(engine/quant/exact_cholesky.py), not LAPACK's, whose last bits moved with the thread count.
tests/engine/test_gptq_deterministic.py checks the bytes under other kernel paths, BLAS paths and
thread counts.
"""
from __future__ import annotations

import math

import torch

from engine.quant.exact_cholesky import inverse_upper_cholesky
from engine.quant.exact_sums import fixed_matmul, gram
from engine.weights.rtn import group_params, quantize_codes, search_group_params
from engine.weights.int_weight import IntWeight


class GPTQ:
    """The Hessian of one layer's inputs (or of several layers that share them: q, k, v) and the
    quantizer that uses it. H accumulates in float64, exactly per block of tokens (exact_sums.gram),
    so its bits do not depend on the CPU; float64 inputs (the tests' oracles) by a plain float64
    matmul."""

    def __init__(self, in_features: int):
        self.in_features = in_features
        self.xtx: torch.Tensor | None = None  # float64 [K, K]: sum_t x_t x_t^T
        self.n_samples = 0
        self.last_loss: float | None = None  # set by quantize(): see there
        self._factor: tuple | None = None  # (damp, desc_act, perm, U): q, k and v share one H

    def add_batch(self, x: torch.Tensor) -> None:
        """Add inputs x [..., K] of the layer (each row one token)."""
        x = x.reshape(-1, x.shape[-1])
        if x.shape[1] != self.in_features:
            raise ValueError(f"inputs have {x.shape[1]} features, the layer {self.in_features}")
        if self.xtx is None:
            self.xtx = torch.zeros(self.in_features, self.in_features, dtype=torch.float64, device=x.device)
        self.xtx += x.T @ x if x.dtype == torch.float64 else gram(x)
        self._factor = None
        self.n_samples += x.shape[0]

    @property
    def H(self) -> torch.Tensor:
        """float64 [K, K]: 2/n sum x x^T, the running average of the calibration tokens."""
        if self.xtx is None or self.n_samples == 0:
            raise ValueError("GPTQ.quantize needs calibration inputs: call add_batch first")
        return self.xtx * (2.0 / self.n_samples)

    def quantize(self, w: torch.Tensor, bits: int, group_size: int, sym: bool, desc_act: bool = False,
                 damp: float = 0.01, block_size: int = 128, static_groups: bool = False,
                 mse: bool = False) -> IntWeight:
        """Quantize w [N, K] (left unchanged). desc_act: columns in order of decreasing H_ii, and
        g_idx (original column order) says which group each column joined. static_groups: group
        parameters from the original W, by original column (g_idx then is k // G).
        Sets self.last_loss = sum_i (w_i - q_i)^2 / (2 [H_F^-1]_ii) (the reference's "error"),
        which equals 1/2 sum_rows (w - q)^T (H + damp I) (w - q), i.e. 1/n ||x W^T - x Q^T||^2
        plus the damping term, with w the input (dead columns set to 0)."""
        self._check(w, bits)
        N, K = w.shape
        G = K if group_size == -1 else group_size
        dt = torch.float64
        H = self.H.to(w.device)
        W = w.to(dt).clone()

        _drop_dead_inputs(H, W)
        params = search_group_params if mse else group_params
        scales, zeros = _group_table(W, G, bits, sym, static_groups, params)

        perm, U = self._inverse_factor(H, damp, desc_act)
        if perm is not None:
            W = W[:, perm]

        Q = torch.empty(N, K, dtype=torch.uint8, device=W.device)
        loss = torch.zeros((), dtype=torch.float64, device=W.device)
        col_group = torch.arange(K, device=W.device) // G  # group of each column in the working order
        if static_groups and perm is not None:
            col_group = perm // G
        for i1 in range(0, K, block_size):
            i2 = min(i1 + block_size, K)
            W1 = W[:, i1:i2].clone()
            E1 = torch.zeros_like(W1)
            U1 = U[i1:i2, i1:i2]
            for i in range(i2 - i1):
                c = i1 + i
                if not static_groups and c % G == 0:  # a group starts: its current values
                    end = min(c + G, K)
                    cur = W1[:, i:end - i1]
                    if end > i2:  # the rest of the group has yet to receive this block's errors
                        cur = torch.cat([cur, W[:, i2:end] - fixed_matmul(E1[:, :i], U[i1:c, i2:end])], dim=1)
                    scales[:, c // G], zeros[:, c // G] = params(cur, bits, sym)
                g = col_group[c]
                s, z = scales[:, g], zeros[:, g]
                col = W1[:, i]
                q = quantize_codes(col, s, z, bits)
                err = (col - s * (q.to(dt) - z)) / U1[i, i]
                loss += (err.double() ** 2).sum() / 2
                W1[:, i:] -= err[:, None] * U1[i, i:][None, :]
                E1[:, i] = err
                Q[:, c] = q
            if i2 < K:
                W[:, i2:] -= fixed_matmul(E1, U[i1:i2, i2:])

        self.last_loss = loss.item()
        Q, g_idx = _original_order(Q, perm, col_group)
        return IntWeight(bits, group_size, Q.contiguous(), scales.float(), zeros.to(torch.uint8), g_idx)

    def _inverse_factor(self, H: torch.Tensor, damp: float, desc_act: bool):
        """(perm, U) of the damped H, in act-order when desc_act; made once for the linears
        that share this Hessian (the factor is the costly step on small layers)."""
        if self._factor is None or self._factor[:2] != (damp, desc_act):
            perm = None
            if desc_act:
                perm = torch.argsort(torch.diag(H), descending=True, stable=True)
                H = H[perm][:, perm]
            self._factor = (damp, desc_act, perm, inverse_cholesky(H, damp))
        return self._factor[2:]

    def _check(self, w: torch.Tensor, bits: int) -> None:
        if w.shape[1] != self.in_features:
            raise ValueError(f"weight has {w.shape[1]} input columns, the Hessian {self.in_features}")
        if not 1 <= bits <= 8:
            raise ValueError(f"bits must be 1..8, got {bits}")


def _drop_dead_inputs(H: torch.Tensor, W: torch.Tensor) -> None:
    """Inputs that are always 0 make any weight exact: use 0, and a unit diagonal so H stays
    invertible (both in place)."""
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0


def inverse_cholesky(H: torch.Tensor, damp: float) -> torch.Tensor:
    """U, upper triangular with U^T U = (H + damp mean(diag H) I)^-1 (H is damped in place): the
    rows GPTQ's column-by-column error feedback reads (Frantar et al., eq. 5 as a Cholesky)."""
    H.diagonal().add_(damp * math.fsum(torch.diag(H).tolist()) / H.shape[0])  # fsum: order-free
    try:
        return inverse_upper_cholesky(H)  # fixed order, exact sums: the module docstring
    except ValueError:
        raise ValueError(f"GPTQ: the Hessian is not positive definite (damp={damp}); raise damp") from None


def _group_table(W: torch.Tensor, G: int, bits: int, sym: bool, static: bool,
                 params=group_params) -> tuple[torch.Tensor, torch.Tensor]:
    """scales, zeros [N, groups]: filled now from the original W (static groups), else empty,
    each group filled when the sweep reaches its first column."""
    n_groups = -(-W.shape[1] // G)
    scales = torch.empty(W.shape[0], n_groups, dtype=W.dtype, device=W.device)
    zeros = torch.empty_like(scales)
    if static:
        for g in range(n_groups):
            scales[:, g], zeros[:, g] = params(W[:, g * G:(g + 1) * G], bits, sym)
    return scales, zeros


def _original_order(Q: torch.Tensor, perm: torch.Tensor | None,
                    col_group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Codes back in the original column order, and g_idx (each column's group) under act-order."""
    if perm is None:
        return Q, None
    g_idx = torch.empty(Q.shape[1], dtype=torch.int32, device=Q.device)
    g_idx[perm] = col_group.to(torch.int32)  # original column perm[j] sits in group of j
    return Q[:, torch.argsort(perm)], g_idx
