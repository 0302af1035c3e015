"""Sums of products whose float64 result is the same on every CPU, whatever the BLAS, its vector
width or its thread count (GPTQ's Hessian, its error feedback, engine/quant/gptq.py, and its
Cholesky factor, engine/quant/exact_cholesky.py).

A BLAS sums a dot product in an order of its own (the kernel its dispatch picks, the threads'
split, FMA or not), and float64 addition is not associative, so the last bits of X^T X differ
between an AVX-512 Xeon, a Zen 4 and a build without vector kernels; GPTQ's rounding decisions
cascade from them. The way out here is to make every partial sum exact, so that no order can
change it: a sum of integers is exact in float64 as long as every partial sum stays within 2^53.

  Each column k of a [T, K] operand is put on a fixed-point grid of `bits` bits under its own
  power of two: e_k = the exponent of max_t |x_tk| (|x| < 2^e_k), x_tk ~ n_tk 2^(e_k - bits) with
  n_tk = round(x_tk 2^(bits - e_k)) an integer, |n_tk| <= 2^bits. The product of two such
  integers is at most 2^(2 bits) and a sum of T of them at most T 2^(2 bits): with
  T 2^(2 bits) <= 2^53 every partial sum a BLAS can form, in any order, with or without FMA,
  is an integer below 2^53, i.e. exact. Scaling the integer result by 2^(e_j + e_k - 2 bits) is
  exact too. max (amax) and round are exact in any order, so the grid itself is the same
  everywhere.

GRAM_BITS = 21 with blocks of GRAM_BLOCK = 2048 rows: 2^11 2^42 = 2^53. 21 bits against the
column's largest value is float32's 24 bits less 3: the Hessian of a calibration set is an
estimate good to a few digits, and its damping (0.01-0.2 of the mean diagonal) is far coarser.
Blocks are then added in their order (elementwise float64 additions: one rounding each, the
same on every CPU).
"""
from __future__ import annotations

import torch

MANTISSA = 53  # float64's significand, the bound every exact partial sum stays within
GRAM_BITS = 21
GRAM_BLOCK = 1 << (MANTISSA - 2 * GRAM_BITS)  # 2048 rows per exact block


def on_grid(x: torch.Tensor, bits: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, e): x ~ n 2^(e - bits) with n integers (float64) of at most `bits` bits and e the
    exponent of the largest |x| along `dim` (kept as a size-1 dim for broadcasting)."""
    x = x.double()
    _, e = torch.frexp(x.abs().amax(dim=dim, keepdim=True))
    return torch.round(torch.ldexp(x, bits - e)), e


def pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e (float64) of integer exponents e: exact."""
    return torch.ldexp(torch.ones(e.shape, dtype=torch.float64, device=e.device), e)


def gram(x: torch.Tensor, total: torch.Tensor | None = None) -> torch.Tensor:
    """float64 [K, K]: sum_t x_t x_t^T of x [T, K], the same bits on every CPU (module docstring):
    each block of GRAM_BLOCK rows exact on its own grid, the blocks added in order. With `total`:
    added to it in place on and below the diagonal blocks only (mirror_lower makes the rest)."""
    K = x.shape[1]
    # x's blocks summed on their own, then added to total: (total + (B1 + B2)), as a sum returned
    # and added would be; one block goes straight in (0 + B1 is B1)
    one = total is not None and x.shape[0] <= GRAM_BLOCK
    out = total if one else torch.zeros(K, K, dtype=torch.float64, device=x.device)
    for t in range(0, x.shape[0], GRAM_BLOCK):
        n, e = on_grid(x[t:t + GRAM_BLOCK], GRAM_BITS, dim=0)  # e [1, K]
        xq = n * pow2(e - GRAM_BITS)  # the block on its grid: integers times 2^(e_k - bits), exact
        lower_gram_(out, xq)
    if total is None:
        return mirror_lower(out)
    if not one:
        total += out
    return total


def lower_gram_(total: torch.Tensor, xq: torch.Tensor, chunk: int = 128) -> None:
    """total += xq^T xq on and below the diagonal blocks of `chunk` columns, about half the
    products. Each entry (j, k) is an integer below 2^53 times 2^(e_j + e_k - 2 bits) in any
    order, so entry (k, j) would have had the same bits: mirror_lower supplies it."""
    for a in range(0, xq.shape[1], chunk):
        b = min(a + chunk, xq.shape[1])
        total[a:b, :b] += xq[:, a:b].T @ xq[:, :b]


def mirror_lower(m: torch.Tensor) -> torch.Tensor:
    """The symmetric matrix whose lower triangle (diagonal included) is m's."""
    return m.tril() + m.tril(-1).T


def fixed_matmul(a: torch.Tensor, b: torch.Tensor, b_bits: int = 24, lower: str = "") -> torch.Tensor:
    """a [N, n] @ b [n, M] in float64 with the same bits on every CPU. b's columns go on grids of
    b_bits; a's rows on grids of two slices (hi + lo) of a_bits each, a_bits = 53 - b_bits -
    log2(n), so each slice's product is exact (module docstring) and the two exact products are
    added once. What is lost: b below 2^-b_bits of its column's largest, a below 2^-2 a_bits of
    its row's largest. lower "a" or "b": that operand is lower triangular (square), and the
    products skip its zero blocks (exact sums without some zero terms: the same bits)."""
    n_inner = a.shape[1]
    if n_inner == 0:
        return torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64, device=a.device)
    a_bits = MANTISSA - b_bits - max(n_inner - 1, 1).bit_length()
    if a_bits < 8:
        raise ValueError(f"fixed_matmul: an inner size of {n_inner} leaves too few bits")
    nb, eb = on_grid(b, b_bits, dim=0)  # eb [1, M]
    a = a.double()
    _, ea = torch.frexp(a.abs().amax(dim=1, keepdim=True))  # ea [N, 1]
    scaled = a * pow2(a_bits - ea)  # |scaled| < 2^a_bits: a power-of-two scaling, exact
    hi = torch.round(scaled)
    lo = torch.round((scaled - hi) * 2.0 ** a_bits)  # the next a_bits bits (scaled - hi is exact)
    # on their grids (powers of two): each output's terms share one scale, 2^(ea_i + eb_j - ...), so
    # every partial sum is an integer below 2^53 times it, exact in any order
    bq = nb * pow2(eb - b_bits)
    # one rounding: hi's exact product plus lo's
    return _product(hi * pow2(ea - a_bits), bq, lower) + _product(lo * pow2(ea - 2 * a_bits), bq, lower)


def _product(a: torch.Tensor, b: torch.Tensor, lower: str, chunks: int = 8) -> torch.Tensor:
    """a @ b, skipping the zero blocks of a lower triangular a (its rows i use columns <= i) or
    b (its column j, rows >= j)."""
    if not lower:
        return a @ b
    n = a.shape[0] if lower == "a" else b.shape[1]
    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    step = -(-n // chunks)
    for c0 in range(0, n, step):
        c1 = min(c0 + step, n)
        if lower == "a":
            out[c0:c1] = a[c0:c1, :c1] @ b[:c1]
        else:
            out[:, c0:c1] = a[:, c0:] @ b[c0:, c0:c1]
    return out
