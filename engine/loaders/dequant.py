"""GGUF tensor bytes -> float32 torch tensors, vectorized over blocks (no per-block Python).

Block layouts are ggml's (ggml-common.h), little-endian, f16 scales. Each function takes the raw
bytes of a whole tensor as a uint8 tensor, views it as [n_blocks, type_size] and returns the
flat float32 weights [n_blocks * block_size] in file order; `dequantize` reshapes to (rows, cols).
`gguf.quants.dequantize` is the oracle (tests/engine/test_dequant.py).
"""
from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """[n, 2] uint8 -> [n, 1] float32 (an f16 field in each block)."""
    return raw.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, 16] packed bytes -> [n, 32] uint8: low nibbles are weights 0..15, high nibbles 16..31."""
    q = torch.empty(qs.shape[0], 2, 16, dtype=torch.uint8, device=qs.device)
    torch.bitwise_and(qs, 15, out=q[:, 0])
    torch.bitwise_right_shift(qs, 4, out=q[:, 1])
    return q.view(-1, 32)


def _bits32(qh: torch.Tensor) -> torch.Tensor:
    """[n, 4] bytes of a little-endian uint32 -> [n, 32] uint8, bit j = weight j's 5th bit << 4."""
    shifts = torch.arange(8, dtype=torch.uint8, device=qh.device)
    return torch.bitwise_left_shift(torch.bitwise_right_shift(qh[:, :, None], shifts) & 1, 4).view(-1, 32)


# Each function: [n_blocks, type_size] uint8 -> [n_blocks * block] float32. In-place float ops
# after one uint8 -> float32 conversion keep it to a few passes over the output.

def dq_q4_0(b: torch.Tensor) -> torch.Tensor:
    # 18 B: f16 d, qs[16]; w = d * (q - 8)
    return _nibbles(b[:, 2:18]).float().sub_(8).mul_(_f16(b[:, 0:2])).view(-1)


def dq_q4_1(b: torch.Tensor) -> torch.Tensor:
    # 20 B: f16 d, f16 m, qs[16]; w = d * q + m
    return _nibbles(b[:, 4:20]).float().mul_(_f16(b[:, 0:2])).add_(_f16(b[:, 2:4])).view(-1)


def dq_q5_0(b: torch.Tensor) -> torch.Tensor:
    # 22 B: f16 d, qh[4] (5th bits), qs[16]; w = d * ((nibble | bit << 4) - 16)
    q = _nibbles(b[:, 6:22]).bitwise_or_(_bits32(b[:, 2:6]))
    return q.float().sub_(16).mul_(_f16(b[:, 0:2])).view(-1)


def dq_q5_1(b: torch.Tensor) -> torch.Tensor:
    # 24 B: f16 d, f16 m, qh[4], qs[16]; w = d * (nibble | bit << 4) + m
    q = _nibbles(b[:, 8:24]).bitwise_or_(_bits32(b[:, 4:8]))
    return q.float().mul_(_f16(b[:, 0:2])).add_(_f16(b[:, 2:4])).view(-1)


def dq_q8_0(b: torch.Tensor) -> torch.Tensor:
    # 34 B: f16 d, int8 qs[32]; w = d * q
    return b[:, 2:34].contiguous().view(torch.int8).float().mul_(_f16(b[:, 0:2])).view(-1)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K 12 scale bytes -> 8 six-bit (sc, m) pairs, one per 32-weight sub-block.

    j < 4: sc = s[j] & 63, m = s[j+4] & 63. j >= 4: the low 4 bits come from s[j+4] (sc in the
    low nibble, m in the high one) and the top 2 bits from the spare bits 6-7 of s[j-4] / s[j].
    """
    s0, s1, s2 = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat((s0 & 63, (s2 & 15) | ((s0 >> 6) << 4)), dim=-1)
    m = torch.cat((s1 & 63, (s2 >> 4) | ((s1 >> 6) << 4)), dim=-1)
    return sc.float(), m.float()


def _k_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, 128] -> [n, 8, 32]: chunk c of 32 bytes gives sub-block 2c (low) and 2c+1 (high)."""
    qs = qs.reshape(-1, 4, 1, 32)
    return torch.cat((qs & 0x0F, qs >> 4), dim=2).reshape(-1, 8, 32)


def dq_q4_k(b: torch.Tensor) -> torch.Tensor:
    # 144 B: f16 d, f16 dmin, scales[12], qs[128]; w = d*sc_j*q - dmin*m_j per sub-block j
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, m = _k_scales(b[:, 4:16])
    q = _k_nibbles(b[:, 16:144]).float()
    return (q * (d * sc)[:, :, None] - (dmin * m)[:, :, None]).flatten()


def q5_k_codes(b: torch.Tensor) -> torch.Tensor:
    """Q5_K blocks -> their 5-bit codes [n, 8, 32] uint8: sub-block j's 5th bit is bit j of qh[l]."""
    shifts = torch.arange(8, dtype=torch.uint8, device=b.device)[None, :, None]
    hi = (b[:, None, 16:48] >> shifts) & 1  # [n, 8, 32]
    return _k_nibbles(b[:, 48:176]) | (hi << 4)


def dq_q5_k(b: torch.Tensor) -> torch.Tensor:
    # 176 B: d, dmin, scales[12], qh[32], qs[128]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, m = _k_scales(b[:, 4:16])
    q = q5_k_codes(b).float()
    return (q * (d * sc)[:, :, None] - (dmin * m)[:, :, None]).flatten()


def q6_k_codes(b: torch.Tensor) -> torch.Tensor:
    """Q6_K blocks -> q - 32 [n, 16, 16] int8, in weight order, one row per 16-weight sub-block.

    210 B: ql[128], qh[64], int8 scales[16], f16 d (last). Two halves of 128 weights; in half
    h with L = ql[64h:], H = qh[32h:], for l < 32 the four 6-bit values are
      q0 = L[l]&15 | (H[l]&3)<<4,    q1 = L[l+32]&15 | (H[l]>>2&3)<<4,
      q2 = L[l]>>4 | (H[l]>>4&3)<<4, q3 = L[l+32]>>4 | (H[l]>>6&3)<<4,
    at weights 128h + 32t + l, and weight i uses scale i // 16; w = d * scale * (q - 32)."""
    ql = b[:, 0:128].reshape(-1, 2, 1, 2, 32)  # [n, half, 1, (l | l+32), 32]
    qh = b[:, None, 128:192].reshape(-1, 2, 1, 1, 32)
    lo = torch.cat((ql & 15, ql >> 4), dim=2)  # [n, 2, (low|high nibble), 2, 32] -> t = 2*nib + k
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).reshape(1, 1, 2, 2, 1)
    return (lo | (((qh >> shifts) & 3) << 4)).reshape(-1, 16, 16).to(torch.int8) - 32


def dq_q6_k(b: torch.Tensor) -> torch.Tensor:
    q = q6_k_codes(b)
    sc = b[:, 192:208].contiguous().view(torch.int8).float()
    d = _f16(b[:, 208:210])
    return (q.float() * (d * sc)[:, :, None]).flatten()


# MXFP4 (gpt-oss's experts, OCP microscaling): E2M1 codes doubled, so the E8M0 scale is halved
_E2M1_X2 = (0., 1., 2., 3., 4., 6., 8., 12., 0., -1., -2., -3., -4., -6., -8., -12.)


def dq_mxfp4(b: torch.Tensor) -> torch.Tensor:
    # 17 B: E8M0 e, qs[16] (low nibbles weights 0..15); w = 2^(e - 128) * E2M1x2[q], the scale's
    # bits built as ggml_e8m0_to_fp32_half builds them (e < 2: a subnormal)
    e = b[:, 0:1].int()
    half = torch.where(e < 2, torch.bitwise_left_shift(torch.full_like(e, 0x00200000), e), (e - 1) << 23)
    table = torch.tensor(_E2M1_X2, device=b.device)
    return table[_nibbles(b[:, 1:17]).long()].mul_(half.view(torch.float32)).view(-1)


def _plain(dtype: torch.dtype):
    return lambda b: b.contiguous().view(dtype).float().flatten()


DEQUANTIZERS = {
    QT.F32: _plain(torch.float32),
    QT.F16: _plain(torch.float16),
    QT.BF16: _plain(torch.bfloat16),
    QT.Q4_0: dq_q4_0, QT.Q4_1: dq_q4_1, QT.Q5_0: dq_q5_0, QT.Q5_1: dq_q5_1, QT.Q8_0: dq_q8_0,
    QT.Q4_K: dq_q4_k, QT.Q5_K: dq_q5_k, QT.Q6_K: dq_q6_k, QT.MXFP4: dq_mxfp4,
}
SUPPORTED_TYPES = frozenset(DEQUANTIZERS)


def tensor_nbytes(qtype: QT, n_elements: int) -> int:
    """Bytes a tensor of `n_elements` takes in `qtype` (raises ValueError off a block boundary)."""
    block, size = GGML_QUANT_SIZES[qtype]
    if n_elements % block:
        raise ValueError(f"{n_elements} elements is not a whole number of {qtype.name} blocks of {block}")
    return n_elements // block * size


def byte_tensor(raw: np.ndarray) -> torch.Tensor:
    """Any numpy view of tensor bytes (e.g. a memory map) -> a flat uint8 torch copy of them."""
    return torch.from_numpy(np.array(raw, copy=True).reshape(-1).view(np.uint8))


def dequantize(raw: np.ndarray | torch.Tensor, qtype: QT, shape: tuple[int, ...],
               device: str | torch.device = "cpu") -> torch.Tensor:
    """Raw tensor bytes (any numpy view of them, e.g. a memory map) -> float32 `shape` on `device`.

    The bytes are copied once (to `device`); on a GPU the unpacking then runs there.
    """
    fn = DEQUANTIZERS.get(QT(qtype))
    if fn is None:
        raise NotImplementedError(f"no dequantizer for tensor type {QT(qtype).name}")
    if isinstance(raw, np.ndarray):
        raw = byte_tensor(raw)
    raw = raw.to(device)
    _, size = GGML_QUANT_SIZES[QT(qtype)]
    n = int(np.prod(shape))
    if raw.numel() != tensor_nbytes(QT(qtype), n):
        raise ValueError(f"{raw.numel()} bytes do not hold {n} {QT(qtype).name} weights")
    return fn(raw.reshape(-1, size)).reshape(shape)
