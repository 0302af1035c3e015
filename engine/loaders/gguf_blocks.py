"""GGUF quantized blocks -> QuantWeight (integer codes, group scales and mins), exactly.

Each GGUF type is rewritten as w = d q + m per group of 32 (16 for Q6_K) with float32 d and m
computed as ggml computes them, so QuantWeight.dequantize() equals gguf.quants.dequantize bit
for bit (tests/kernels/test_repack.py):
  Q4_0  d (q - 8)            -> 4-bit q, d, m = -8 d       (d q and 8 d are exact in float32)
  Q4_1  d q + m              -> 4-bit q, d, m
  Q4_K  d sc_j q - dmin m_j  -> 4-bit q, d sc_j, -(dmin m_j) per 32-value sub-block j
  Q5_0  d (q - 16)           -> 8-bit q - 16, d
  Q5_1  d q + m              -> 8-bit q, d, m
  Q5_K  like Q4_K, 5-bit q   -> 8-bit q, d sc_j, -(dmin m_j)
  Q6_K  d sc_j (q - 32)      -> 8-bit q - 32, d sc_j per 16-value sub-block
  Q8_0  d q                  -> 8-bit q, d
Block layouts and the bit fiddling are shared with engine/loaders/dequant.py.
"""
from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

from engine.loaders.dequant import _bits32, _f16, _k_nibbles, _k_scales, _nibbles, q5_k_codes, q6_k_codes
from engine.weights.quant_weight import QuantWeight, SuperScales


def _q4_0(b):
    d = _f16(b[:, 0:2])
    return 4, 32, _nibbles(b[:, 2:18]), d, -8 * d


def _q4_1(b):
    return 4, 32, _nibbles(b[:, 4:20]), _f16(b[:, 0:2]), _f16(b[:, 2:4])


def _q4_k(b):
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, m = _k_scales(b[:, 4:16])
    return (4, 32, _k_nibbles(b[:, 16:144]).reshape(-1, 32), (d * sc).reshape(-1, 1), (-(dmin * m)).reshape(-1, 1),
            (d, sc, -dmin, m))


def _q5_0(b):
    q = _nibbles(b[:, 6:22]).bitwise_or_(_bits32(b[:, 2:6])).to(torch.int8) - 16
    return 8, 32, q, _f16(b[:, 0:2]), None


def _q5_1(b):
    q = _nibbles(b[:, 8:24]).bitwise_or_(_bits32(b[:, 4:8])).to(torch.int8)
    return 8, 32, q, _f16(b[:, 0:2]), _f16(b[:, 2:4])


def _q5_k(b):
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, m = _k_scales(b[:, 4:16])
    q = q5_k_codes(b).to(torch.int8).reshape(-1, 32)
    return 8, 32, q, (d * sc).reshape(-1, 1), (-(dmin * m)).reshape(-1, 1), (d, sc, -dmin, m)


def _q6_k(b):
    q = q6_k_codes(b).reshape(-1, 16)
    sc = b[:, 192:208].contiguous().view(torch.int8).float()
    d = _f16(b[:, 208:210])
    return 8, 16, q, (d * sc).reshape(-1, 1), None, (d, sc, None, None)


def _q8_0(b):
    return 8, 32, b[:, 2:34].contiguous().view(torch.int8), _f16(b[:, 0:2]), None


REPACKERS = {QT.Q4_0: _q4_0, QT.Q4_1: _q4_1, QT.Q4_K: _q4_k, QT.Q5_0: _q5_0, QT.Q5_1: _q5_1,
             QT.Q5_K: _q5_k, QT.Q6_K: _q6_k, QT.Q8_0: _q8_0}
REPACKABLE = frozenset(REPACKERS)


def from_gguf_blocks(raw: torch.Tensor, qtype: QT, shape: tuple[int, int]) -> QuantWeight:
    """The raw bytes of a [N, K] tensor of `qtype` -> its QuantWeight (rows in file order)."""
    fn = REPACKERS.get(QT(qtype))
    if fn is None:
        raise NotImplementedError(f"no repack for tensor type {QT(qtype).name}")
    N, K = shape
    _, size = GGML_QUANT_SIZES[QT(qtype)]
    bits, group, q, d, m, *k = fn(raw.reshape(-1, size))
    sup = None
    if k:  # K-quants: the super-block scales (one per 256 values) and the per-group codes
        ds, dc, ms, mc = k[0]
        sup = SuperScales(ds.reshape(N, K // 256), dc.reshape(N, K // group).to(torch.int8),
                          None if ms is None else ms.reshape(N, K // 256),
                          None if mc is None else mc.reshape(N, K // group).to(torch.int8))
    return QuantWeight(bits, group, q.reshape(N, K), d.reshape(N, K // group).float(),
                       None if m is None else m.reshape(N, K // group).float(), sup)
