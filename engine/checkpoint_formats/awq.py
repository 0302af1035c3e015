"""AWQ GEMM (AutoAWQ gemm.py, packing_utils.py; b = 4 only, always with zero points, no g_idx):
    qweight  int32 [K, N/8]   q[n, k] packed along N, interleaved:
    qzeros   int32 [n_g, N/8] z[n, g] packed along N, interleaved:
             nibble i of word c holds column 8c + [0, 2, 4, 6, 1, 3, 5, 7][i]
    scales   fp16  [n_g, N]
w = (iw - iz) s with no +1 (there is no v1-style offset). (Notation: engine/checkpoint_formats/__init__.py.)
"""
from __future__ import annotations

import torch

from engine.checkpoint_formats.checks import FLOATS, INT32, expect, multiple, n_groups
from engine.checkpoint_formats.words import codes_to_words, words_to_codes
from engine.model_files.quant_config import QuantSpec
from engine.weights.int_weight import IntWeight

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds column 8c + AWQ_ORDER[i]


def tensor_names(spec: QuantSpec) -> tuple[str, ...]:
    return ("qweight", "qzeros", "scales")


def encode(w: IntWeight, spec: QuantSpec) -> dict[str, torch.Tensor]:
    """IntWeight -> qweight, qzeros (columns interleaved) and scales."""
    N = w.shape[0]
    multiple(N, 8, "out_features", "AWQ packs 8 columns per word", "encode (awq)")
    cols = (torch.arange(N) // 8) * 8 + torch.tensor(AWQ_ORDER)[torch.arange(N) % 8]
    return {"qweight": codes_to_words(w.q.t()[:, cols], 4, 1), "qzeros": codes_to_words(w.zeros.t()[:, cols], 4, 1),
            "scales": w.scales.t().to(torch.float16).contiguous()}


def decode(tensors: dict[str, torch.Tensor], spec: QuantSpec, shape: tuple[int, int], where: str) -> IntWeight:
    """One linear's tensors -> IntWeight, each checked against shape and spec."""
    N, K = shape
    ng = n_groups(K, spec.group_size)
    why = f"N={N} out, K={K} in, {spec.bits}-bit, group {spec.group_size}"
    scales = expect(tensors, "scales", FLOATS, (ng, N), where, why).float().t().contiguous()
    multiple(N, 8, "out_features", "AWQ packs 8 columns per word", where)
    qweight = expect(tensors, "qweight", INT32, (K, N // 8), where, why)
    qzeros = expect(tensors, "qzeros", INT32, (ng, N // 8), where, why)
    inverse = torch.argsort(torch.tensor(AWQ_ORDER))  # [0, 4, 1, 5, 2, 6, 3, 7]
    cols = (torch.arange(N) // 8) * 8 + inverse[torch.arange(N) % 8]
    q, z = words_to_codes(qweight, 4, 1, N)[:, cols], words_to_codes(qzeros, 4, 1, N)[:, cols]
    return IntWeight(4, spec.group_size, q.t().contiguous(), scales, z.t().contiguous())
