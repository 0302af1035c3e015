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

import numpy as np
import torch

from engine.quant.exact_cholesky import inverse_upper_cholesky
from engine.quant.exact_sums import fixed_matmul, gram, mirror_lower
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
            self._lower = torch.zeros_like(self.xtx)  # the exact sums' lower blocks (gram), mirrored once
        if x.dtype == torch.float64:
            self.xtx += x.T @ x
        else:
            gram(x, self._lower)
        self._factor = None
        self.n_samples += x.shape[0]

    @property
    def H(self) -> torch.Tensor:
        """float64 [K, K]: 2/n sum x x^T, the running average of the calibration tokens."""
        if self.xtx is None or self.n_samples == 0:
            raise ValueError("GPTQ.quantize needs calibration inputs: call add_batch first")
        return (self.xtx + mirror_lower(self._lower)) * (2.0 / self.n_samples)

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
        H = self.H.to(w.device)
        W = w.to(torch.float64).clone()

        _drop_dead_inputs(H, W)
        params = search_group_params if mse else group_params
        scales, zeros = _group_table(W, G, bits, sym, static_groups, params)

        perm, U = self._inverse_factor(H, damp, desc_act)
        if perm is not None:
            W = W[:, perm]

        col_group = torch.arange(K, device=W.device) // G  # group of each column in the working order
        if static_groups and perm is not None:
            col_group = perm // G
        sweep = _Sweep(W, U, scales, zeros, bits, G, col_group.tolist(), None if static_groups else params, sym)
        for i1 in range(0, K, block_size):
            sweep.block(i1, min(i1 + block_size, K))
        Q = torch.from_numpy(sweep.codes.T).to(torch.uint8)
        self.last_loss = sweep.loss
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


class _Sweep:
    """GPTQ's column-by-column sweep (GPTQ.quantize), one block of columns at a time. The block's
    columns and errors are numpy rows (column-major, so each column is contiguous) and each step
    is numpy's elementwise float64 ops, one IEEE rounding each as torch's, in the same order:
    the same bits as torch's ops at a fraction of their per-call cost. The block's products with
    the rest of W stay exact sums (exact_sums.fixed_matmul)."""

    def __init__(self, W, U, scales, zeros, bits, G, col_group, params, sym):
        self.W, self.U, self.scales, self.zeros, self.bits, self.G = W, U, scales, zeros, bits, G
        self.col_group, self.params, self.sym = col_group, params, sym  # params None: static groups
        self.codes = np.empty((W.shape[1], W.shape[0]))  # [K, N]: column c's codes (integers)
        self.loss = 0.0
        self.group: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # g -> (scale, zero) columns

    def _params(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        if g not in self.group:
            self.group[g] = (self.scales[:, g].numpy().copy(), self.zeros[:, g].numpy().copy())
        return self.group[g]

    def _group_start(self, W1: np.ndarray, E1: np.ndarray, i1: int, i: int, i2: int) -> None:
        """A group starts at column i1 + i: its parameters from its current values (the rest of
        the group, past this block, given this block's errors so far first)."""
        c, W, K = i1 + i, self.W, self.W.shape[1]
        end = min(c + self.G, K)
        cur = torch.from_numpy(W1[i:end - i1].T)
        if end > i2:
            cur = torch.cat([cur, W[:, i2:end] - fixed_matmul(torch.from_numpy(E1[:i].T), self.U[i1:c, i2:end])], dim=1)
        g = c // self.G
        self.scales[:, g], self.zeros[:, g] = self.params(cur, self.bits, self.sym)
        self.group.pop(g, None)

    def block(self, i1: int, i2: int) -> None:
        W1 = self.W[:, i1:i2].T.numpy().copy()  # [B, N]
        E1 = np.zeros_like(W1)
        U1 = self.U[i1:i2, i1:i2].numpy()
        maxq = float(2 ** self.bits - 1)
        for i in range(i2 - i1):
            c = i1 + i
            if self.params is not None and c % self.G == 0:
                self._group_start(W1, E1, i1, i, i2)
            s, z = self._params(self.col_group[c])
            col = W1[i]
            q = col / s  # quantize_codes: clamp(round(w / scale) + zero, 0, maxq)
            np.rint(q, out=q)
            q += z
            np.clip(q, 0.0, maxq, out=q)
            err = (col - s * (q - z)) / U1[i, i]
            W1[i + 1:] -= np.multiply.outer(U1[i, i + 1:], err)
            E1[i] = err
            self.codes[c] = q
        self.loss += float((E1 * E1).sum()) / 2
        if i2 < self.W.shape[1]:
            self.W[:, i2:] -= fixed_matmul(torch.from_numpy(E1.T), self.U[i1:i2, i2:])


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
