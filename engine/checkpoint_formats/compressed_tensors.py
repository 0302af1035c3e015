"""compressed-tensors "pack-quantized" (llm-compressor's W4A16/W8A16 layout, what vLLM reads
first; b in {4, 8}):
    weight_packed      int32 [N, ceil(K/P)]        q packed along K (zero-padded to a word)
    weight_scale       fp16/bf16 [N, n_g]          (strategy "channel": [N, 1])
    weight_zero_point  int32 [ceil(N/P), n_g]      z packed along N (asymmetric only)
    weight_shape       int64 [2] = (N, K)          (as compressed_tensors and vLLM declare it)
    weight_g_idx       int32 [K]                   (actorder "group" only)
The library quantizes to signed ints and packs value + 2^(b-1) (pack_to_int32), and its zero
point is signed alike, so the packed fields are exactly our unsigned q and z; symmetric means
z = 2^(b-1) everywhere and no zero-point tensor. (Notation: engine/checkpoint_formats/__init__.py.)

Checked against compressed_tensors' PackedQuantizationCompressor / pack_to_int32 (signed codes
+ 2^(b-1), P per int32 along K, the first lowest; zero points packed the same way along N) and
vLLM's CompressedTensorsWNA16 (weight_shape int64 [2], weight_g_idx int32 [K]).
"""
from __future__ import annotations

import torch

from engine.checkpoint_formats.checks import FLOATS, INDEX, INT32, expect, n_groups, read_g_idx
from engine.checkpoint_formats.words import codes_to_words, words_to_codes
from engine.model_files.quant_config import CheckpointError, QuantSpec
from engine.weights.int_weight import IntWeight


def tensor_names(spec: QuantSpec) -> tuple[str, ...]:
    return (("weight_packed", "weight_scale") + (() if spec.sym else ("weight_zero_point",))
            + ("weight_shape",) + (("weight_g_idx",) if spec.desc_act else ()))


def encode(w: IntWeight, spec: QuantSpec) -> dict[str, torch.Tensor]:
    """IntWeight -> weight_packed, weight_scale, weight_shape (and the zero points, g_idx)."""
    N, K = w.shape
    mid = 1 << (spec.bits - 1)
    out = {"weight_packed": codes_to_words(w.q, spec.bits, 1),
           "weight_scale": w.scales.to(torch.float16).contiguous(),
           "weight_shape": torch.tensor([N, K], dtype=torch.int64)}
    if spec.sym:
        if not bool((w.zeros == mid).all()):
            raise CheckpointError(f"encode (compressed-tensors): symmetric spec but zero points "
                                  f"other than {mid}: the format would drop them (use sym=False)")
    else:
        out["weight_zero_point"] = codes_to_words(w.zeros, spec.bits, 0)
    if spec.desc_act:
        out["weight_g_idx"] = w.groups().to(torch.int32)
    return out


def decode(tensors: dict[str, torch.Tensor], spec: QuantSpec, shape: tuple[int, int], where: str) -> IntWeight:
    """One linear's tensors -> IntWeight, each checked against shape and spec."""
    N, K = shape
    b, per, ng = spec.bits, 32 // spec.bits, n_groups(K, spec.group_size)
    why = f"N={N} out, K={K} in, {b}-bit, group {spec.group_size}"
    packed = expect(tensors, "weight_packed", INT32, (N, -(-K // per)), where, why)
    scales = expect(tensors, "weight_scale", FLOATS, (N, ng), where, why).float().contiguous()
    stored = expect(tensors, "weight_shape", INDEX, (2,), where, "(out, in)").tolist()
    if stored != [N, K]:
        raise CheckpointError(f"{where}: tensor 'weight_shape' says {stored}, expected {[N, K]}")
    if spec.sym:
        if "weight_zero_point" in tensors:
            raise CheckpointError(f"{where}: tensor 'weight_zero_point' present but the config says symmetric")
        z = torch.full((N, ng), 1 << (b - 1), dtype=torch.uint8)
    else:
        zp = expect(tensors, "weight_zero_point", INT32, (-(-N // per), ng), where, why)
        z = words_to_codes(zp, b, 0, N)
    g_idx = None
    if spec.desc_act:
        g_idx = read_g_idx(tensors, "weight_g_idx", K, spec.group_size, where, why)
    return IntWeight(b, spec.group_size, words_to_codes(packed, b, 1, K), scales, z, g_idx)
