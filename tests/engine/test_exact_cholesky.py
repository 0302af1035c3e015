"""GPTQ's inverse Cholesky factor of our own (engine/quant/exact_cholesky.py, issue 69): the same
factor LAPACK gives to float32's precision, the same bits under every thread count, and a
Hessian that is not positive definite refused."""
from __future__ import annotations

import pytest
import torch

from engine.quant.exact_cholesky import PANEL, cholesky_lower, inverse_upper_cholesky, lower_inverse, subtract_outer_gram_
from engine.quant.exact_sums import fixed_matmul, gram, mirror_lower
from test_quantizers import correlated


def damped_hessian(K: int, seed: int) -> torch.Tensor:
    x = correlated(2 * K, K, seed=seed).double()
    H = x.T @ x / (2 * K)
    return H + 0.01 * H.diagonal().mean() * torch.eye(K, dtype=torch.float64)


@pytest.mark.parametrize("K", [5, PANEL, 3 * PANEL + 7])  # one panel, exactly one, blocks and a rest
def test_factor_matches_lapack(K):
    H = damped_hessian(K, seed=K)
    U = inverse_upper_cholesky(H)
    reference = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    assert torch.equal(U, U.triu())
    assert (U - reference).abs().max() <= 1e-6 * reference.abs().max()
    L = cholesky_lower(H)
    assert torch.allclose(L @ L.T, H, rtol=0, atol=1e-6 * H.abs().max().item())
    assert torch.allclose(lower_inverse(L) @ L, torch.eye(K, dtype=torch.float64), rtol=0, atol=1e-6)


def test_factor_bits_do_not_depend_on_the_thread_count():
    H = damped_hessian(3 * PANEL + 7, seed=3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = inverse_upper_cholesky(H)
        torch.set_num_threads(2)
        two = inverse_upper_cholesky(H)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_not_positive_definite_is_refused():
    H = damped_hessian(16, seed=2)
    H[7, 7] = -1.0
    with pytest.raises(ValueError, match="not positive definite"):
        inverse_upper_cholesky(H)


def test_exact_sums_have_the_same_bits_however_they_are_split():
    """What keeps GPTQ's bits while making it cheaper: products that skip a triangle's zero blocks,
    a Hessian accumulated on its lower blocks and mirrored once, equal the plain exact products."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(200, 200, dtype=torch.float64, generator=g).tril()
    b = torch.randn(200, 130, dtype=torch.float64, generator=g)
    assert torch.equal(fixed_matmul(a, b, lower="a"), fixed_matmul(a, b))
    assert torch.equal(fixed_matmul(b.T, a, lower="b"), fixed_matmul(b.T, a))
    x = torch.randn(3000, 150, generator=g) * torch.rand(150, generator=g)
    total = torch.zeros(150, 150, dtype=torch.float64)
    for part in (x[:1000], x[1000:]):  # a call of one block, then one of two
        gram(part, total)
    assert torch.equal(mirror_lower(total), gram(x[:1000]) + gram(x[1000:]))
    full = gram(x[:500])
    A = full.clone()
    subtract_outer_gram_(A, b[:150, :64], chunk=64)
    B = full.clone()
    subtract_outer_gram_(B, b[:150, :64], chunk=1000)  # one chunk: the whole product
    assert torch.equal(A.tril(), B.tril())


def test_the_pivots_sqrt_is_the_correctly_rounded_one():
    """torch's float64 sqrt of a 0-d tensor is 1 ulp off for this pivot (0x1.9b62236becb71p-1, the
    correctly rounded root ends in 70): a kernel whose last bit another vendor's CPU could round
    otherwise. The factor's first entry is pivot / sqrt(pivot) with IEEE's sqrt."""
    import math
    from fractions import Fraction

    x = 0.6455851101594835
    root, half_ulp = math.sqrt(x), Fraction(2) ** -54  # roots in [0.5, 1): ulp 2^-53
    assert (Fraction(root) - half_ulp) ** 2 <= Fraction(x) <= (Fraction(root) + half_ulp) ** 2  # correctly rounded
    got = cholesky_lower(torch.tensor([[x]], dtype=torch.float64))[0, 0].item()
    assert got == float(Fraction(x) / Fraction(root))  # one rounding of the exact quotient
