"""The decoder stack's SwiGLU and GeGLU (engine/kernels/csrc/pointwise.h) against glibc's own
expf, called through ctypes: e^x is computed 8 lanes at a time, and must give libm's bits for
every value, the overflow, underflow and nan lanes that fall back to libm included. The rest of
each formula is float32 IEEE arithmetic in the scalar line's order, done here by numpy."""
from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import pytest
import torch

from engine.kernels import kernels

pytestmark = pytest.mark.skipif(kernels() is None or not hasattr(kernels(), "gated_act"),
                                reason="Ember's CPU kernels are not built (python -m engine.kernels.build)")

_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.expf.argtypes, _libm.expf.restype = [ctypes.c_float], ctypes.c_float
K2 = np.float32(2 * 0.7978845608028654)


def libm_exp(x: np.ndarray) -> np.ndarray:
    return np.array([_libm.expf(float(v)) for v in x], dtype=np.float32)


def expected(gu: np.ndarray, gelu: bool) -> np.ndarray:
    """g / (1 + e^a) * u in float32, a = -g (SiLU) or -k2 (g + 0.044715 g^3) (GELU's tanh form)."""
    f = gu.shape[1] // 2
    g, u = gu[:, :f].ravel(), gu[:, f:].ravel()
    with np.errstate(all="ignore"):
        a = -K2 * (g + np.float32(0.044715) * g * g * g) if gelu else -g
        y = g / (np.float32(1) + libm_exp(a)) * u
    return y.reshape(gu.shape[0], f)


def values(n: int, seed: int) -> np.ndarray:
    """Gates over the range that matters (|g| up to ~100, so e^a under- and overflows), with the
    edges: +-0, the 88 limit of the vector lanes, inf, nan, subnormals."""
    rng = np.random.default_rng(seed)
    edges = np.array([0.0, -0.0, 88.0, -88.0, 87.99999, -87.99999, 88.00001, 103.97, -103.97, 104.0, -104.0,
                      np.inf, -np.inf, np.nan, 1e-40, -1e-40, 1e-30, 20.0, -20.0], dtype=np.float32)
    body = (rng.standard_normal(n) * rng.choice([0.5, 4, 40], n)).astype(np.float32)
    return np.concatenate([edges, body])


@pytest.mark.parametrize("gelu", [False, True], ids=["swiglu", "geglu"])
@pytest.mark.parametrize("rows,f", [(1, 1536), (3, 37), (64, 576)])
def test_gated_act_has_libm_expf_bits(gelu, rows, f):
    """Row widths that are and are not multiples of the 8 lanes (the scalar tail), rows split
    over threads."""
    g = values(rows * f, seed=rows + f)[: rows * f]
    u = np.random.default_rng(1).standard_normal(rows * f).astype(np.float32)
    gu = np.concatenate([g.reshape(rows, f), u.reshape(rows, f)], axis=1)
    got = kernels().gated_act(torch.from_numpy(gu), gelu).numpy()
    want = expected(gu, gelu)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{(~same).sum()} values differ, first at gate {gu[:, :f].ravel()[~same.ravel()][:3]}"


def test_gated_act_refuses_bad_shapes():
    with pytest.raises(RuntimeError, match="float32"):
        kernels().gated_act(torch.zeros(2, 3), False)
    with pytest.raises(RuntimeError, match="float32"):
        kernels().gated_act(torch.zeros(2, 4, dtype=torch.float64), False)
