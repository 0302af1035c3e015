"""GPTQ (AutoGPTQ qlinear_cuda_old / GPTQModel; b in {4, 8}; tensors `<module>.<suffix>`):
    qweight  int32 [K/P, N]   q[n, k] packed along K (rows of K, per output column n)
    qzeros   int32 [n_g, N/P] z[n, g] packed along N
    scales   fp16  [n_g, N]
    g_idx    int32 [K]        group of input column k: k // G, or any map (desc_act = act-order)
checkpoint_format "gptq" (v1, the default when absent) stores the zero points minus one; GPTQModel
converts by whole-word arithmetic, which is what we do both ways:
    v2 word = v1 word + 0x11111111 (b = 4) or + 0x01010101 (b = 8)   (mod 2^32)
so a symmetric 4-bit v1 file (z = 8) has every qzeros word 0x77777777 (8-bit: 0x7F7F7F7F).
z = 0 (asymmetric only) has no v1 nibble: the subtraction stores 0xF there and borrows one
from the next nibble up. GPTQModel's word-wise load undoes it exactly; per-nibble readers
(AutoGPTQ's torch kernel, exllama: z = (nibble + 1) & 15) see that neighbour's zero one too
low (GPTQModel's comments call it "overflow"; AutoGPTQ's own v1 writer ORs 0xF into every
higher nibble of that word instead). Write asymmetric weights as gptq_v2 to be safe everywhere.
g_idx is always written (k // G unless desc_act); a file without it is read as k // G unless
its config says desc_act. Read back, a g_idx equal to k // G becomes IntWeight.g_idx None.
(Notation: engine/checkpoint_formats/__init__.py.)
"""
from __future__ import annotations

import torch

from engine.checkpoint_formats.checks import FLOATS, INT32, expect, multiple, n_groups, read_g_idx
from engine.checkpoint_formats.words import add_words, codes_to_words, ones_word, words_to_codes
from engine.model_files.quant_config import CheckpointFormat, QuantSpec
from engine.weights.int_weight import IntWeight


def tensor_names(spec: QuantSpec) -> tuple[str, ...]:
    return ("qweight", "qzeros", "scales", "g_idx")


def _check_shape(N: int, K: int, bits: int, where: str) -> None:
    per = 32 // bits
    multiple(K, per, "in_features", f"GPTQ packs {per} rows per word", where)
    multiple(N, per, "out_features", f"GPTQ packs {per} zero points per word", where)


def encode(w: IntWeight, spec: QuantSpec) -> dict[str, torch.Tensor]:
    """IntWeight -> qweight, qzeros (v1: minus one, word-wise), scales and g_idx."""
    N, K = w.shape
    _check_shape(N, K, spec.bits, "encode (gptq)")
    qzeros = codes_to_words(w.zeros.t(), spec.bits, 1)
    if spec.format is CheckpointFormat.GPTQ:
        qzeros = add_words(qzeros, -ones_word(spec.bits))  # v1: z - 1, word-wise as GPTQModel
    return {"qweight": codes_to_words(w.q.t(), spec.bits, 0), "qzeros": qzeros,
            "scales": w.scales.t().to(torch.float16).contiguous(), "g_idx": w.groups().to(torch.int32)}


def decode(tensors: dict[str, torch.Tensor], spec: QuantSpec, shape: tuple[int, int], where: str) -> IntWeight:
    """One linear's tensors -> IntWeight, each checked against shape and spec."""
    N, K = shape
    b, per, ng = spec.bits, 32 // spec.bits, n_groups(K, spec.group_size)
    why = f"N={N} out, K={K} in, {b}-bit, group {spec.group_size}"
    scales = expect(tensors, "scales", FLOATS, (ng, N), where, why).float().t().contiguous()
    _check_shape(N, K, b, where)
    qweight = expect(tensors, "qweight", INT32, (K // per, N), where, why)
    qzeros = expect(tensors, "qzeros", INT32, (ng, N // per), where, why)
    g_idx = None
    if "g_idx" in tensors or spec.desc_act:
        g_idx = read_g_idx(tensors, "g_idx", K, spec.group_size, where, why)
    if spec.format is CheckpointFormat.GPTQ:
        qzeros = add_words(qzeros, ones_word(b))  # v1 -> v2
    q = words_to_codes(qweight, b, 0, K).t().contiguous()
    z = words_to_codes(qzeros, b, 1, N).t().contiguous()
    return IntWeight(b, spec.group_size, q, scales, z, g_idx)
