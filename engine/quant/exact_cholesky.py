"""GPTQ's inverse Cholesky factor in float64 with the same bits on every CPU (issue 69): a blocked
Cholesky and triangular inverse of our own, in place of LAPACK's, whose last bits depend on the
BLAS kernel, its vector width and its thread count.

Every step is one of two kinds, and neither depends on an order a kernel picks:
  - elementwise (a sqrt, a division, a rank-1 update x_i y_j subtracted as a product then a
    difference: one IEEE rounding each, the same at any vector width; no fused multiply-add; the
    pivot's sqrt is math.sqrt, correctly rounded, where torch's float64 sqrt of a 0-d tensor is
    not always: 1 ulp off for 0.6455851101594835, so a vendor's kernel could round it otherwise);
  - a block product on fixed-point grids whose partial sums are exact integers (exact_sums).
Inside a panel of PANEL columns the factor is formed by right-looking rank-1 updates; the panel
then updates the trailing matrix by one exact product of its rows on 23-bit grids
(subtract_outer_gram_).
The inverse halves the triangle and joins the halves by exact_sums.fixed_matmul (24 bits of each
column on the right, about 30 on the left). So the factor agrees with LAPACK's to ~3e-8 of its
largest value (measured at K = 576..3072), as fine as the 21-bit Hessian it factors and far finer
than the damping added to it. Since only exact sums and elementwise steps decide the bits, how
they are computed is free: the products skip the triangles' zero blocks and the trailing
update's upper half (the Cholesky reads only the lower triangle), the panels' steps run in
numpy (the same IEEE operations at a fraction of torch's per-call cost). Cost at one thread
(CPU seconds, a loaded machine): Qwen2.5-Coder-1.5B's down_proj, K = 8960, 38 s (66 s before
those changes; LAPACK's, for scale, ~40 s, extrapolated from K = 4096).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from engine.quant.exact_sums import MANTISSA, fixed_matmul, pow2

PANEL = 64


def subtract_outer_gram_(A: torch.Tensor, P: torch.Tensor, chunk: int = 256) -> None:
    """A -= P P^T (A float64 [R, R], P [R, n]) with the same bits everywhere, on and below the
    diagonal blocks of `chunk` rows (the Cholesky reads only the lower triangle): each row of P
    on a grid of `bits` bits under its own power of two, 2 bits + log2(n) <= 53, so the integer
    product is exact (exact_sums' module docstring). For a panel of 64 that keeps 23 bits of
    each row: the trailing update is then as fine as the 21-bit Hessian it updates."""
    bits = (MANTISSA - max(P.shape[1] - 1, 1).bit_length()) // 2
    _, e = torch.frexp(P.abs().amax(dim=1, keepdim=True))  # [R, 1]
    Pq = torch.round(P * pow2(bits - e)) * pow2(e - bits)  # P on its grid: integers 2^(e_i - bits)
    for a in range(0, P.shape[0], chunk):  # entry (i, j): an integer below 2^53 times 2^(e_i + e_j - 2 bits)
        b = min(a + chunk, P.shape[0])
        A[a:b, :b] -= Pq[a:b] @ Pq[:b].T


def cholesky_lower(A: torch.Tensor) -> torch.Tensor:
    """L lower triangular with L L^T = A (float64, symmetric positive definite; only its lower
    triangle is read); ValueError if a pivot is not positive. The panels' rank-1 updates are
    numpy's elementwise float64 ops on the transposed panel (each column contiguous): one IEEE
    rounding each, as torch's, in the same order."""
    A = A.double().clone()
    K = A.shape[0]
    L = torch.zeros_like(A)
    for k in range(0, K, PANEL):
        e = min(k + PANEL, K)
        P = A[k:, k:e].T.numpy().copy()  # [w, R]: row j is the panel's column j
        for j in range(e - k):  # the panel's columns, each a rank-1 update of the rest of the panel
            pivot = P[j, j]
            if not pivot > 0:
                raise ValueError("not positive definite")
            P[j, j:] = P[j, j:] / math.sqrt(pivot)  # IEEE's sqrt, correctly rounded on every CPU
            if j + 1 < e - k:
                P[j + 1:, j + 1:] -= np.multiply.outer(P[j, j + 1:e - k], P[j, j + 1:])
        L[k:, k:e] = torch.from_numpy(P.T).tril()
        if e < K:  # the trailing matrix, by one exact-sum product
            subtract_outer_gram_(A[e:, e:], L[e:, k:e])
    return L


def lower_inverse(L: torch.Tensor) -> torch.Tensor:
    """L^-1 of a lower triangular L: [[A, 0], [B, C]]^-1 = [[A^-1, 0], [-C^-1 B A^-1, C^-1]],
    halved down to PANEL columns, which are solved by rank-1 updates (numpy's, as above)."""
    K = L.shape[0]
    if K <= PANEL:
        X = np.eye(K)
        Ln = L.numpy()
        for j in range(K):
            X[j] = X[j] / Ln[j, j]
            if j + 1 < K:
                X[j + 1:] -= np.multiply.outer(Ln[j + 1:, j], X[j])
        return torch.from_numpy(X)
    h = K // 2
    Ai, Ci = lower_inverse(L[:h, :h]), lower_inverse(L[h:, h:])
    X = torch.zeros_like(L)
    X[:h, :h], X[h:, h:] = Ai, Ci
    X[h:, :h] = -fixed_matmul(fixed_matmul(Ci, L[h:, :h], lower="a"), Ai, lower="b")
    return X


def inverse_upper_cholesky(H: torch.Tensor) -> torch.Tensor:
    """U upper triangular with U^T U = H^-1, the rows GPTQ reads. With J the reversal,
    J H J = L L^T gives H = V V^T for the upper V = J L J, so H^-1 = V^-T V^-1 and U = V^-1 =
    J L^-1 J: one Cholesky and one triangular inverse."""
    L = cholesky_lower(torch.flip(H, (0, 1)))
    return torch.flip(lower_inverse(L), (0, 1))
