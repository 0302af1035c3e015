"""The checkpoint layouts of one quantized linear (GPTQ v1/v2, AWQ GEMM, compressed-tensors) and
their quantization_config, both directions. This docstring is the one description of the layouts.

Notation: N = out_features, K = in_features, b = bits, P = 32 // b codes per int32 word,
G = group_size (-1: one group spans K), n_g = ceil(K / G) (1 when G = -1). Codes and zero points
are unsigned, 0 .. 2^b - 1, exactly IntWeight's q and zeros:  w[n, k] = s[n, g(k)] (q[n, k] - z[n, g(k)]).
"Packed along an axis" means P consecutive codes per int32 word, the first in the lowest bits:
    code[i] = (word[i // P] >> b (i % P)) & (2^b - 1)      (words are int32 bit patterns)

GPTQ (AutoGPTQ qlinear_cuda_old / GPTQModel; b in {4, 8}; tensors `<module>.<suffix>`):
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

AWQ GEMM (AutoAWQ gemm.py, packing_utils.py; b = 4 only, always with zero points, no g_idx):
    qweight  int32 [K, N/8]   q[n, k] packed along N, interleaved:
    qzeros   int32 [n_g, N/8] z[n, g] packed along N, interleaved:
             nibble i of word c holds column 8c + [0, 2, 4, 6, 1, 3, 5, 7][i]
    scales   fp16  [n_g, N]
  w = (iw - iz) s with no +1 (there is no v1-style offset).

compressed-tensors "pack-quantized" (llm-compressor; what vLLM reads first; b in {4, 8}):
    weight_packed      int32 [N, ceil(K/P)]        q packed along K (zero-padded to a word)
    weight_scale       fp16/bf16 [N, n_g]          (strategy "channel": [N, 1])
    weight_zero_point  int32 [ceil(N/P), n_g]      z packed along N (asymmetric only)
    weight_shape       int64 [2] = (N, K)          (as compressed_tensors and vLLM declare it)
    weight_g_idx       int32 [K]                   (actorder "group" only)
  The library quantizes to signed ints and packs value + 2^(b-1) (pack_to_int32), and its zero
  point is signed alike, so the packed fields are exactly our unsigned q and z; symmetric means
  z = 2^(b-1) everywhere and no zero-point tensor.
  (engine/quant/compressed_tensors.py holds this format's code.)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.model_files.quant_config import (CheckpointError, CheckpointFormat, QuantSpec, check_spec,  # noqa: F401
                                             parse_quantization_config, quantization_config)
from engine.weights.int_weight import IntWeight


AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds column 8c + AWQ_ORDER[i]
INT32 = (torch.int32,)
INDEX = (torch.int32, torch.int64)
FLOATS = (torch.float16, torch.bfloat16, torch.float32)


# ---- bit packing (shared with compressed_tensors.py) ----

def as_int32(u: torch.Tensor) -> torch.Tensor:
    """int64 values in 0 .. 2^32 - 1 -> int32 with the same bits."""
    u = u & 0xFFFFFFFF
    return torch.where(u >= 2**31, u - 2**32, u).to(torch.int32)


def pack_bits(codes: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words of 32/bits consecutive codes along `dim`, first code lowest; zero-padded."""
    per = 32 // bits
    c = codes.to(torch.int64).movedim(dim, -1)
    c = F.pad(c, (0, -c.shape[-1] % per))
    c = c.reshape(*c.shape[:-1], -1, per) << (torch.arange(per) * bits)
    return as_int32(c.sum(-1)).movedim(-1, dim).contiguous()  # fields are disjoint: sum == or


def unpack_bits(words: torch.Tensor, bits: int, dim: int, n: int) -> torch.Tensor:
    """uint8 codes: the inverse of pack_bits, cut to n along `dim`."""
    per = 32 // bits
    u = words.to(torch.int64).movedim(dim, -1) & 0xFFFFFFFF
    c = (u.unsqueeze(-1) >> (torch.arange(per) * bits)) & ((1 << bits) - 1)
    return c.reshape(*u.shape[:-1], -1)[..., :n].movedim(-1, dim).to(torch.uint8).contiguous()


def ones_word(bits: int) -> int:
    """A 1 in every field of a word: 0x11111111 for 4 bits, 0x01010101 for 8."""
    return sum(1 << (bits * i) for i in range(32 // bits))


def add_words(words: torch.Tensor, delta: int) -> torch.Tensor:
    return as_int32(words.to(torch.int64) + delta)


# ---- checks ----

def n_groups(K: int, group_size: int) -> int:
    return 1 if group_size == -1 else -(-K // group_size)


def default_groups(K: int, group_size: int) -> torch.Tensor:
    return torch.zeros(K, dtype=torch.long) if group_size == -1 else torch.arange(K) // group_size


def expect(tensors: dict[str, torch.Tensor], name: str, dtypes: tuple[torch.dtype, ...],
           shape: tuple[int, ...], where: str, why: str) -> torch.Tensor:
    """tensors[name], checked for presence, dtype and shape; `why` says where the shape comes from."""
    t = tensors.get(name)
    want = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
    if t is None:
        raise CheckpointError(f"{where}: tensor '{name}' is missing (expected {want} {list(shape)}; "
                              f"found {sorted(tensors) or 'none'})")
    if t.dtype not in dtypes:
        raise CheckpointError(f"{where}: tensor '{name}' has dtype {str(t.dtype).removeprefix('torch.')}, "
                              f"expected {want}")
    if tuple(t.shape) != tuple(shape):
        raise CheckpointError(f"{where}: tensor '{name}' has shape {list(t.shape)}, expected "
                              f"{list(shape)} ({why})")
    return t


def check_weight(w: IntWeight, spec: QuantSpec, where: str) -> None:
    """An IntWeight that `spec` can carry without loss."""
    check_spec(spec, where)
    if (w.bits, w.group_size) != (spec.bits, spec.group_size):
        raise CheckpointError(f"{where}: weight is {w.bits}-bit group {w.group_size}, spec says "
                              f"{spec.bits}-bit group {spec.group_size}")
    top = (1 << spec.bits) - 1
    if int(w.q.max()) > top or int(w.zeros.max()) > top:
        raise CheckpointError(f"{where}: codes above {top} do not fit {spec.bits} bits")
    K = w.shape[1]
    if not spec.desc_act and not torch.equal(w.groups(), default_groups(K, spec.group_size)):
        raise CheckpointError(f"{where}: the weight has act-order groups (g_idx) but the spec has "
                              f"desc_act false, so readers would ignore them")


def check_g_idx(g: torch.Tensor, n_g: int, name: str, where: str) -> torch.Tensor | None:
    """int32 g_idx, or None when it is k // G (kept only when the groups are really permuted)."""
    if g.numel() and (int(g.min()) < 0 or int(g.max()) >= n_g):
        raise CheckpointError(f"{where}: tensor '{name}' holds groups {int(g.min())}..{int(g.max())}, "
                              f"expected 0..{n_g - 1}")
    return g.to(torch.int32)


def _multiple(value: int, of: int, what: str, why: str, where: str) -> None:
    if value % of:
        raise CheckpointError(f"{where}: {what} = {value} is not a multiple of {of} ({why})")


# ---- one linear's tensors ----

def tensor_names(spec: QuantSpec) -> tuple[str, ...]:
    """Suffixes of one linear's tensors (the first is the packed weight; some may be optional)."""
    if spec.format is CheckpointFormat.COMPRESSED_TENSORS:
        from engine.quant import compressed_tensors
        return compressed_tensors.tensor_names(spec)
    if spec.format is CheckpointFormat.AWQ:
        return ("qweight", "qzeros", "scales")
    return ("qweight", "qzeros", "scales", "g_idx")


def pack_linear(w: IntWeight, spec: QuantSpec) -> dict[str, torch.Tensor]:
    """suffix -> tensor, in the dtypes the format stores."""
    check_weight(w, spec, f"pack_linear ({spec.format})")
    if spec.format is CheckpointFormat.COMPRESSED_TENSORS:
        from engine.quant import compressed_tensors
        return compressed_tensors.pack(w, spec)
    scales = w.scales.t().to(torch.float16).contiguous()
    if spec.format is CheckpointFormat.AWQ:
        N = w.shape[0]
        _multiple(N, 8, "out_features", "AWQ packs 8 columns per word", "pack_linear (awq)")
        cols = (torch.arange(N) // 8) * 8 + torch.tensor(AWQ_ORDER)[torch.arange(N) % 8]
        return {"qweight": pack_bits(w.q.t()[:, cols], 4, 1), "qzeros": pack_bits(w.zeros.t()[:, cols], 4, 1),
                "scales": scales}
    per = 32 // spec.bits
    N, K = w.shape
    _multiple(K, per, "in_features", f"GPTQ packs {per} rows per word", "pack_linear (gptq)")
    _multiple(N, per, "out_features", f"GPTQ packs {per} zero points per word", "pack_linear (gptq)")
    qzeros = pack_bits(w.zeros.t(), spec.bits, 1)
    if spec.format is CheckpointFormat.GPTQ:
        qzeros = add_words(qzeros, -ones_word(spec.bits))  # v1: z - 1, word-wise as GPTQModel
    return {"qweight": pack_bits(w.q.t(), spec.bits, 0), "qzeros": qzeros, "scales": scales,
            "g_idx": w.groups().to(torch.int32)}


def unpack_linear(tensors: dict[str, torch.Tensor], spec: QuantSpec, shape: tuple[int, int],
                  where: str) -> IntWeight:
    """The IntWeight of one linear [N = out, K = in], every tensor checked against shape and spec."""
    check_spec(spec, where)
    if spec.format is CheckpointFormat.COMPRESSED_TENSORS:
        from engine.quant import compressed_tensors
        return compressed_tensors.unpack(tensors, spec, shape, where)
    N, K = shape
    b, per, ng = spec.bits, 32 // spec.bits, n_groups(K, spec.group_size)
    why = f"N={N} out, K={K} in, {b}-bit, group {spec.group_size}"
    scales = expect(tensors, "scales", FLOATS, (ng, N), where, why).float().t().contiguous()
    if spec.format is CheckpointFormat.AWQ:
        _multiple(N, 8, "out_features", "AWQ packs 8 columns per word", where)
        qweight = expect(tensors, "qweight", INT32, (K, N // 8), where, why)
        qzeros = expect(tensors, "qzeros", INT32, (ng, N // 8), where, why)
        inverse = torch.argsort(torch.tensor(AWQ_ORDER))  # [0, 4, 1, 5, 2, 6, 3, 7]
        cols = (torch.arange(N) // 8) * 8 + inverse[torch.arange(N) % 8]
        q, z = unpack_bits(qweight, 4, 1, N)[:, cols], unpack_bits(qzeros, 4, 1, N)[:, cols]
        return IntWeight(4, spec.group_size, q.t().contiguous(), scales, z.t().contiguous())
    _multiple(K, per, "in_features", f"GPTQ packs {per} rows per word", where)
    _multiple(N, per, "out_features", f"GPTQ packs {per} zero points per word", where)
    qweight = expect(tensors, "qweight", INT32, (K // per, N), where, why)
    qzeros = expect(tensors, "qzeros", INT32, (ng, N // per), where, why)
    g_idx = None
    if "g_idx" in tensors or spec.desc_act:
        g = check_g_idx(expect(tensors, "g_idx", INDEX, (K,), where, why), ng, "g_idx", where)
        g_idx = None if torch.equal(g.long(), default_groups(K, spec.group_size)) else g
    if spec.format is CheckpointFormat.GPTQ:
        qzeros = add_words(qzeros, ones_word(b))  # v1 -> v2
    q = unpack_bits(qweight, b, 0, K).t().contiguous()
    z = unpack_bits(qzeros, b, 1, N).t().contiguous()
    return IntWeight(b, spec.group_size, q, scales, z, g_idx)
