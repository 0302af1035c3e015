"""IntWeight: a linear layer's weights as GPTQ and AWQ define them, independent of any file layout.

    w[n, k] = scales[n, g(k)] * (q[n, k] - zeros[n, g(k)]),   g(k) = g_idx[k]  (or k // group_size)

q and zeros are unsigned codes in 0 .. 2^bits - 1; a symmetric quantizer has zeros = 2^(bits-1)
everywhere. scales hold float16 values (the checkpoints store float16), kept as float32 here.
g_idx is present for act-order (desc_act) checkpoints, whose groups are not contiguous in k.

The kernels' QuantWeight is w = d q' + m per contiguous group (engine/weights/quant_weight.py); with
the input columns put in group order by a permutation P (x[:, P] at run time), the two agree:
    4-bit:  q' = q,        d = s,  m = -s z
    8-bit:  q' = q - 128,  d = s,  m = s (128 - z)     (int8 codes; m = 0 when symmetric)
m is rounded to float16 so that the tiles hold float16 scales, as a GGUF Q4_1's do: at most
2^-11 |m| off, 1/136 of a quantization step at 4 bits (|m| <= 15 s) and 1/16 at 8 bits; exact
when symmetric (-8 s is a power-of-two multiple of a float16, and 8-bit m is 0).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.weights.quant_weight import QuantWeight


@dataclass(frozen=True, slots=True)
class IntWeight:
    bits: int  # 4 or 8 (the formats also carry 2 and 3 for GPTQ; the kernels take 4 and 8)
    group_size: int  # -1: one group spans all of K
    q: torch.Tensor  # uint8 [N, K], codes 0 .. 2^bits - 1
    scales: torch.Tensor  # float32 [N, n_groups], float16 values
    zeros: torch.Tensor  # uint8 [N, n_groups], codes 0 .. 2^bits - 1
    g_idx: torch.Tensor | None = None  # int32 [K]: group of input column k; None: k // group_size

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    @property
    def n_groups(self) -> int:
        K = self.q.shape[1]
        return 1 if self.group_size == -1 else -(-K // self.group_size)

    def groups(self) -> torch.Tensor:
        """int64 [K]: the group of every input column."""
        K = self.q.shape[1]
        if self.g_idx is not None:
            return self.g_idx.long()
        if self.group_size == -1:
            return torch.zeros(K, dtype=torch.long)
        return torch.arange(K) // self.group_size

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K]: s (q - z), the reference every format and the kernels are held to."""
        g = self.groups()
        return self.scales[:, g] * (self.q.float() - self.zeros[:, g].float())

    def to_quant_weight(self) -> QuantWeight | None:
        """The same weight for the kernels (see the module docstring), or None when its groups
        cannot be made contiguous runs of a multiple of 32 columns (then the loader holds it dense)."""
        N, K = self.shape
        G = K if self.group_size == -1 else self.group_size
        perm = None
        if self.g_idx is not None:
            g = self.g_idx.long()
            if not torch.equal(g, torch.arange(K) // G):  # act-order: sort the columns by group
                perm = torch.argsort(g, stable=True)
                if not torch.equal(g[perm], torch.arange(K) // G):
                    return None  # groups of unequal sizes: no contiguous layout exists
        if G % 32 or K % 32:
            return None
        q = self.q if perm is None else self.q[:, perm]
        s, z = self.scales, self.zeros.float()
        if K % G:  # a short last group (SmolLM2's 576 = 4.5 x 128): the kernels' 32 columns each
            s, z = (t[:, torch.arange(K // 32) * 32 // G] for t in (s, z))
            G = 32
        if self.bits == 4:
            codes, m = q.to(torch.uint8), -(s * z)
        elif self.bits == 8:
            codes, m = (q.to(torch.int16) - 128).to(torch.int8), s * (128 - z)
        else:
            return None
        m = m.half().float()
        if self.bits == 8 and not m.any():
            m = None
        return QuantWeight(self.bits, G, codes.contiguous(), s.float().contiguous(), m, perm=perm)


def cat_int_rows(parts: list[IntWeight]) -> IntWeight:
    """Weights of one input stacked by rows as one (Phi-3's qkv_proj from q, k and v): GPTQ
    rounds each row alone under the input's one Hessian, so the parts share bits, groups and
    act-order, and the stack is the fused linear quantized."""
    first = parts[0]
    for p in parts[1:]:
        same_g = (p.g_idx is None and first.g_idx is None) or (
            p.g_idx is not None and first.g_idx is not None and torch.equal(p.g_idx, first.g_idx))
        if (p.bits, p.group_size, p.shape[1]) != (first.bits, first.group_size, first.shape[1]) or not same_g:
            raise ValueError("cannot stack weights of other bits, groups, widths or act-order as one linear")
    return IntWeight(first.bits, first.group_size, torch.cat([p.q for p in parts]),
                     torch.cat([p.scales for p in parts]), torch.cat([p.zeros for p in parts]), first.g_idx)
