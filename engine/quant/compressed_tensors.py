"""compressed-tensors "pack-quantized" (llm-compressor's W4A16/W8A16 layout, what vLLM reads
first): its quantization_config and one linear's tensors. The layout is described in
engine/quant/formats.py; callers go through formats' functions, which dispatch here.

Checked against compressed_tensors' PackedQuantizationCompressor / pack_to_int32 (signed codes
+ 2^(b-1), P per int32 along K, the first lowest; zero points packed the same way along N) and
vLLM's CompressedTensorsWNA16 (weight_shape int64 [2], weight_g_idx int32 [K]).
"""
from __future__ import annotations

import torch

from engine.model_files.quant_config import CheckpointError, CheckpointFormat, QuantSpec, check_spec
from engine.quant.formats import FLOATS, INDEX, INT32, check_g_idx, default_groups, expect, n_groups, pack_bits, unpack_bits
from engine.weights.int_weight import IntWeight



def tensor_names(spec: QuantSpec) -> tuple[str, ...]:
    return (("weight_packed", "weight_scale") + (() if spec.sym else ("weight_zero_point",))
            + ("weight_shape",) + (("weight_g_idx",) if spec.desc_act else ()))


def pack(w: IntWeight, spec: QuantSpec) -> dict[str, torch.Tensor]:
    N, K = w.shape
    mid = 1 << (spec.bits - 1)
    out = {"weight_packed": pack_bits(w.q, spec.bits, 1),
           "weight_scale": w.scales.to(torch.float16).contiguous(),
           "weight_shape": torch.tensor([N, K], dtype=torch.int64)}
    if spec.sym:
        if not bool((w.zeros == mid).all()):
            raise CheckpointError(f"pack_linear (compressed-tensors): symmetric spec but zero points "
                                  f"other than {mid}: the format would drop them (use sym=False)")
    else:
        out["weight_zero_point"] = pack_bits(w.zeros, spec.bits, 0)
    if spec.desc_act:
        out["weight_g_idx"] = w.groups().to(torch.int32)
    return out


def unpack(tensors: dict[str, torch.Tensor], spec: QuantSpec, shape: tuple[int, int], where: str) -> IntWeight:
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
        z = unpack_bits(zp, b, 0, N)
    g_idx = None
    if spec.desc_act:
        g = check_g_idx(expect(tensors, "weight_g_idx", INDEX, (K,), where, why), ng, "weight_g_idx", where)
        g_idx = None if torch.equal(g.long(), default_groups(K, spec.group_size)) else g
    return IntWeight(b, spec.group_size, unpack_bits(packed, b, 1, K), scales, z, g_idx)
