"""Checkpoint layouts of one quantized linear (engine/checkpoint_formats/) against the formats'
own descriptions: the expected int32 words and the float64 dequantization are built here with
plain loops from the published layouts (AutoGPTQ qlinear_cuda_old, AutoAWQ packing_utils,
compressed_tensors pack_to_int32), never with the packer under test."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.checkpoint_formats.registry import decode_linear, encode_linear, tensor_names
from engine.model_files.quant_config import (CheckpointError, CheckpointFormat as CF, QuantSpec,
                                             parse_quantization_config, quantization_config)
from engine.weights.int_weight import IntWeight

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ: nibble i of word c holds column 8c + AWQ_ORDER[i]
ONES = {4: 0x11111111, 8: 0x01010101}  # GPTQModel's v1 <-> v2 word offset


def signed(u: int) -> int:
    return u - (1 << 32) if u >= 1 << 31 else u


def u32(t: torch.Tensor) -> list:
    return (t.long() & 0xFFFFFFFF).tolist()


def field(word: int, i: int, bits: int) -> int:
    return ((word & 0xFFFFFFFF) >> (bits * i)) & ((1 << bits) - 1)


def ngroups(K: int, G: int) -> int:
    return 1 if G == -1 else -(-K // G)


def weight(N, K, bits, G, *, sym=False, act_order=False, seed=0, zmin=0) -> IntWeight:
    gen = torch.Generator().manual_seed(seed)
    top, ng = 1 << bits, ngroups(K, G)
    q = torch.randint(0, top, (N, K), generator=gen, dtype=torch.uint8)
    zeros = (torch.full((N, ng), top // 2, dtype=torch.uint8) if sym
             else torch.randint(zmin, top, (N, ng), generator=gen, dtype=torch.uint8))
    scales = (torch.rand(N, ng, generator=gen) * 0.1 + 1e-3).half().float()
    g_idx = None
    if act_order:
        g_idx = (torch.arange(K) // G)[torch.randperm(K, generator=gen)].to(torch.int32)
    return IntWeight(bits, G, q, scales, zeros, g_idx)


def spec(fmt, bits=4, G=32, sym=False, desc_act=False, ignore=("lm_head",)) -> QuantSpec:
    return QuantSpec(fmt, bits, G, sym, desc_act, ignore)


def groups_of(w: IntWeight) -> list[int]:
    K, G = w.shape[1], w.group_size
    return w.g_idx.tolist() if w.g_idx is not None else [0 if G == -1 else k // G for k in range(K)]


def same(a: IntWeight, b: IntWeight) -> None:
    assert (a.bits, a.group_size) == (b.bits, b.group_size)
    assert torch.equal(a.q, b.q) and torch.equal(a.zeros, b.zeros) and torch.equal(a.scales, b.scales)
    assert torch.equal(a.groups(), b.groups())


# ---- GPTQ ----

def gptq_expected(w: IntWeight, v1: bool) -> dict[str, list]:
    N, K = w.shape
    b, P = w.bits, 32 // w.bits
    q, z, s = w.q.tolist(), w.zeros.tolist(), w.scales.tolist()
    qweight = [[signed(sum(q[n][r * P + i] << (b * i) for i in range(P))) for n in range(N)] for r in range(K // P)]
    qzeros = []
    for g in range(len(z[0])):
        row = []
        for c in range(N // P):
            word = sum(z[c * P + i][g] << (b * i) for i in range(P))
            row.append(signed((word - ONES[b]) % (1 << 32) if v1 else word))
        qzeros.append(row)
    return {"qweight": qweight, "qzeros": qzeros, "scales": [[s[n][g] for n in range(N)] for g in range(len(z[0]))],
            "g_idx": groups_of(w)}


def gptq_reference(t: dict[str, torch.Tensor], bits: int, v1: bool, N: int, K: int) -> torch.Tensor:
    """W[n,k] = s[g,n] (q - (z + 1)) on the stored v1 nibbles (AutoGPTQ), s (q - z) for v2."""
    P, qw, qz = 32 // bits, t["qweight"].tolist(), t["qzeros"].tolist()
    s, g = t["scales"].double(), t["g_idx"].tolist()
    out = torch.zeros(N, K, dtype=torch.float64)
    for n in range(N):
        for k in range(K):
            qv = field(qw[k // P][n], k % P, bits)
            zv = field(qz[g[k]][n // P], n % P, bits) + (1 if v1 else 0)
            out[n, k] = s[g[k], n] * (qv - zv)
    return out


@pytest.mark.parametrize("fmt", [CF.GPTQ, CF.GPTQ_V2])
@pytest.mark.parametrize("bits,G,act_order",
                         [(4, 32, False), (8, 32, False), (4, -1, False), (4, 16, True), (8, 16, True)])
def test_gptq_words_and_dequant(fmt, bits, G, act_order):
    N, K = 16, 64
    w = weight(N, K, bits, G, act_order=act_order, seed=bits + G, zmin=1)  # zmin 1: no v1 borrow (see below)
    sp = spec(fmt, bits, G, desc_act=act_order)
    t = encode_linear(w, sp)
    assert set(t) == set(tensor_names(sp))
    assert {k: v.dtype for k, v in t.items()} == {"qweight": torch.int32, "qzeros": torch.int32,
                                                  "scales": torch.float16, "g_idx": torch.int32}
    exp = gptq_expected(w, v1=fmt is CF.GPTQ)
    for name, want in exp.items():
        assert t[name].tolist() == want, name
    back = decode_linear(t, sp, (N, K), "x")
    same(back, w)
    assert (back.g_idx is None) == (not act_order)
    ref = gptq_reference(t, bits, fmt is CF.GPTQ, N, K)
    assert torch.equal(back.dequantize().double(), ref)
    assert torch.equal(w.dequantize().double(), ref)


def test_gptq_literal_words():
    N, K = 8, 8
    q = torch.zeros(N, K, dtype=torch.uint8)
    q[0] = torch.arange(1, 9)  # column n=0 over the 8 K rows: nibbles 1..8, lowest first
    z = torch.tensor([[1], [2], [3], [4], [5], [6], [7], [8]], dtype=torch.uint8)
    w = IntWeight(4, -1, q, torch.ones(N, 1), z)
    v2, v1 = encode_linear(w, spec(CF.GPTQ_V2, G=-1)), encode_linear(w, spec(CF.GPTQ, G=-1))
    assert u32(v2["qweight"])[0][0] == 0x87654321
    assert u32(v2["qzeros"]) == [[0x87654321]] and u32(v1["qzeros"]) == [[0x76543210]]


def test_sym_v1_qzeros_are_0x77777777():
    for bits, word in ((4, 0x77777777), (8, 0x7F7F7F7F)):
        t = encode_linear(weight(16, 64, bits, 32, sym=True), spec(CF.GPTQ, bits, 32, sym=True))
        assert set(sum(u32(t["qzeros"]), [])) == {word}


@pytest.mark.parametrize("bits", [4, 8])
def test_v1_v2_relation(bits):
    w = weight(32, 64, bits, 32, seed=3)  # zeros include 0: the relation holds word-wise regardless
    v1, v2 = encode_linear(w, spec(CF.GPTQ, bits)), encode_linear(w, spec(CF.GPTQ_V2, bits))
    assert [[(a + ONES[bits]) % (1 << 32) for a in row] for row in u32(v1["qzeros"])] == u32(v2["qzeros"])
    for name in ("qweight", "scales", "g_idx"):
        assert torch.equal(v1[name], v2[name])


def test_v1_zero_point_zero_borrows_like_gptqmodel():
    """z = 0 has no v1 nibble: v2 0x88888880 - 0x11111111 = 0x7777776F (0xF, then 6 borrowed),
    which the word-wise v1 -> v2 conversion restores exactly."""
    z = torch.tensor([0, 8, 8, 8, 8, 8, 8, 8], dtype=torch.uint8)[:, None]
    w = IntWeight(4, -1, torch.zeros(8, 8, dtype=torch.uint8), torch.ones(8, 1), z)
    sp = spec(CF.GPTQ, G=-1)
    t = encode_linear(w, sp)
    assert u32(t["qzeros"]) == [[0x7777776F]]
    assert decode_linear(t, sp, (8, 8), "x").zeros[:, 0].tolist() == z[:, 0].tolist()


def test_trivial_g_idx_reads_as_none_and_missing_g_idx_is_k_over_g():
    w = weight(16, 64, 4, 16)
    sp = spec(CF.GPTQ_V2, G=16)
    t = encode_linear(w, sp)
    assert t["g_idx"].tolist() == [k // 16 for k in range(64)]
    assert decode_linear(t, sp, (16, 64), "x").g_idx is None
    del t["g_idx"]
    same(decode_linear(t, sp, (16, 64), "x"), w)
    with pytest.raises(CheckpointError, match="'g_idx' is missing"):
        decode_linear(t, spec(CF.GPTQ_V2, G=16, desc_act=True), (16, 64), "x")


def test_group_minus_one_is_one_group():
    w = weight(16, 64, 4, -1, seed=5)
    for fmt in (CF.GPTQ, CF.AWQ, CF.COMPRESSED_TENSORS):
        t = encode_linear(w, spec(fmt, G=-1))
        scale = t["weight_scale"] if fmt is CF.COMPRESSED_TENSORS else t["scales"]
        assert scale.numel() == 16
        same(decode_linear(t, spec(fmt, G=-1), (16, 64), "x"), w)
    assert encode_linear(w, spec(CF.GPTQ, G=-1))["g_idx"].tolist() == [0] * 64


def test_act_order_needs_desc_act():
    w = weight(16, 64, 4, 16, act_order=True)
    for fmt in (CF.GPTQ, CF.AWQ, CF.COMPRESSED_TENSORS):
        with pytest.raises(CheckpointError, match="desc_act"):
            encode_linear(w, spec(fmt, G=16))


# ---- AWQ ----

def test_awq_words_and_dequant():
    N, K, G = 16, 64, 32
    w = weight(N, K, 4, G, seed=7)
    sp = spec(CF.AWQ, 4, G)
    t = encode_linear(w, sp)
    assert {k: v.dtype for k, v in t.items()} == {"qweight": torch.int32, "qzeros": torch.int32,
                                                  "scales": torch.float16}
    q, z = w.q.tolist(), w.zeros.tolist()
    assert t["qweight"].tolist() == [[signed(sum(q[8 * c + AWQ_ORDER[i]][k] << (4 * i) for i in range(8)))
                                      for c in range(N // 8)] for k in range(K)]
    assert t["qzeros"].tolist() == [[signed(sum(z[8 * c + AWQ_ORDER[i]][g] << (4 * i) for i in range(8)))
                                     for c in range(N // 8)] for g in range(K // G)]
    back = decode_linear(t, sp, (N, K), "x")
    same(back, w)
    qw, qz, s = t["qweight"].tolist(), t["qzeros"].tolist(), t["scales"].double()
    ref = torch.zeros(N, K, dtype=torch.float64)
    for n in range(N):
        i = AWQ_ORDER.index(n % 8)
        for k in range(K):  # W^T = (iw - iz) s, no +1
            ref[n, k] = (field(qw[k][n // 8], i, 4) - field(qz[k // G][n // 8], i, 4)) * s[k // G, n]
    assert torch.equal(back.dequantize().double(), ref)


def test_awq_literal_word():
    q = torch.arange(8, dtype=torch.uint8)[:, None].expand(8, 8).contiguous()  # column n holds n
    w = IntWeight(4, -1, q, torch.ones(8, 1), torch.zeros(8, 1, dtype=torch.uint8))
    assert u32(encode_linear(w, spec(CF.AWQ, G=-1))["qweight"]) == [[0x75316420]] * 8


# ---- compressed-tensors ----

@pytest.mark.parametrize("bits,G,sym,act_order,K", [(4, 32, True, False, 64), (4, 32, False, False, 64),
                                                    (8, 16, False, True, 64), (8, -1, True, False, 64),
                                                    (4, 12, False, False, 36)])
def test_compressed_tensors_words_and_dequant(bits, G, sym, act_order, K):
    N, P = 12, 32 // bits
    w = weight(N, K, bits, G, sym=sym, act_order=act_order, seed=bits * K)
    sp = spec(CF.COMPRESSED_TENSORS, bits, G, sym=sym, desc_act=act_order)
    t = encode_linear(w, sp)
    assert set(t) == set(tensor_names(sp))
    assert ("weight_zero_point" in t) == (not sym) and ("weight_g_idx" in t) == act_order
    q, z = w.q.tolist(), w.zeros.tolist()
    assert t["weight_packed"].tolist() == [[signed(sum(q[n][c * P + i] << (bits * i)
                                                       for i in range(P) if c * P + i < K))
                                            for c in range(-(-K // P))] for n in range(N)]
    assert t["weight_shape"].dtype == torch.int64 and t["weight_shape"].tolist() == [N, K]
    assert t["weight_scale"].shape == (N, ngroups(K, G))
    if not sym:
        assert t["weight_zero_point"].tolist() == [
            [signed(sum(z[r * P + i][g] << (bits * i) for i in range(P) if r * P + i < N)) for g in range(len(z[0]))]
            for r in range(-(-N // P))]
    back = decode_linear(t, sp, (N, K), "x")
    same(back, w)
    # compressed_tensors dequantize: (x_q - zp) * s on signed codes (packed value - 2^(b-1))
    mid, pw, s = 1 << (bits - 1), t["weight_packed"].tolist(), t["weight_scale"].double()
    zp = t["weight_zero_point"].tolist() if not sym else None
    g = groups_of(w)
    ref = torch.zeros(N, K, dtype=torch.float64)
    for n in range(N):
        for k in range(K):
            xq = field(pw[n][k // P], k % P, bits) - mid
            zq = 0 if sym else field(zp[n // P][g[k]], n % P, bits) - mid
            ref[n, k] = (xq - zq) * s[n, g[k]]
    assert torch.equal(back.dequantize().double(), ref)


def test_compressed_tensors_literal_word():
    """pack_to_int32's own example: signed 8-bit [1, 2] -> unsigned [129, 130] -> 33409."""
    q = torch.tensor([[129, 130, 0, 0]], dtype=torch.uint8).expand(4, 4).contiguous()
    w = IntWeight(8, -1, q, torch.ones(4, 1), torch.full((4, 1), 128, dtype=torch.uint8))
    assert encode_linear(w, spec(CF.COMPRESSED_TENSORS, 8, -1, sym=True))["weight_packed"].tolist() == [[33409]] * 4


def test_compressed_tensors_sym_needs_mid_zeros():
    with pytest.raises(CheckpointError, match="zero points"):
        encode_linear(weight(8, 32, 4, 32), spec(CF.COMPRESSED_TENSORS, sym=True))


# ---- bad tensors ----

FORMATS = [(CF.GPTQ, 4), (CF.GPTQ_V2, 8), (CF.AWQ, 4), (CF.COMPRESSED_TENSORS, 4)]


def packed(fmt, bits, desc_act=True, sym=False):
    desc_act = desc_act and fmt is not CF.AWQ
    sp = spec(fmt, bits, 16, sym=sym, desc_act=desc_act)
    return sp, encode_linear(weight(16, 64, bits, 16, act_order=desc_act, sym=sym), sp)


@pytest.mark.parametrize("fmt,bits", FORMATS)
def test_missing_wrong_shape_wrong_dtype(fmt, bits):
    sp, t = packed(fmt, bits)
    where = "/ckpt/model.safetensors: model.layers.0.mlp.up_proj"
    for name in t:
        with pytest.raises(CheckpointError, match=f"^{where}: tensor '{name}' is missing"):
            decode_linear({k: v for k, v in t.items() if k != name}, sp, (16, 64), where)
        bad = t | {name: t[name][:-1]}
        with pytest.raises(CheckpointError, match=f"'{name}' has shape"):
            decode_linear(bad, sp, (16, 64), where)
        wrong = torch.int16 if t[name].dtype.is_floating_point else torch.float32
        with pytest.raises(CheckpointError, match=f"'{name}' has dtype"):
            decode_linear(t | {name: t[name].to(wrong)}, sp, (16, 64), where)
    with pytest.raises(CheckpointError, match="shape"):  # a config/architecture that disagrees
        decode_linear(t, sp, (16, 128), where)


@pytest.mark.parametrize("fmt,name", [(CF.GPTQ, "g_idx"), (CF.COMPRESSED_TENSORS, "weight_g_idx")])
def test_g_idx_out_of_range(fmt, name):
    sp, t = packed(fmt, 4)
    g = t[name].clone()
    g[3] = 4  # K=64, G=16: groups 0..3
    with pytest.raises(CheckpointError, match=f"'{name}' holds groups 0..4, expected 0..3"):
        decode_linear(t | {name: g}, sp, (16, 64), "x")


def test_compressed_tensors_disagreements():
    sp, t = packed(CF.COMPRESSED_TENSORS, 4, desc_act=False)
    with pytest.raises(CheckpointError, match="weight_shape' says"):
        decode_linear(t | {"weight_shape": torch.tensor([64, 16])}, sp, (16, 64), "x")
    sym = spec(CF.COMPRESSED_TENSORS, 4, 16, sym=True)
    with pytest.raises(CheckpointError, match="'weight_zero_point' present"):
        decode_linear(t, sym, (16, 64), "x")


def test_pack_rejects_out_of_range_codes_and_odd_sizes():
    w = weight(16, 64, 8, 32)
    with pytest.raises(CheckpointError, match="4-bit"):
        encode_linear(w, spec(CF.GPTQ, 4, 32))
    with pytest.raises(CheckpointError, match="not a multiple of 8"):
        encode_linear(weight(12, 64, 4, 32), spec(CF.AWQ, 4, 32))


# ---- quantization_config ----

@pytest.mark.parametrize("sp", [
    spec(CF.GPTQ), spec(CF.GPTQ_V2, 8, 128, sym=True, desc_act=True), spec(CF.GPTQ, G=-1, ignore=()),
    spec(CF.GPTQ_V2, ignore=("visual", "lm_head")), spec(CF.AWQ, G=128),
    spec(CF.AWQ, G=64, ignore=("mlp.gate", "lm_head")),
    spec(CF.COMPRESSED_TENSORS, 4, 128, sym=True), spec(CF.COMPRESSED_TENSORS, 8, -1, desc_act=False),
    spec(CF.COMPRESSED_TENSORS, 4, 32, sym=False, desc_act=True, ignore=("lm_head", "re:.*gate$"))])
def test_config_round_trip(sp):
    cfg = json.loads(json.dumps(quantization_config(sp)))
    assert parse_quantization_config(cfg, "config.json") == sp


def test_published_configs():
    gptqmodel = {"bits": 4, "checkpoint_format": "gptq", "damp_percent": 0.01, "desc_act": True, "group_size": 128,
                 "lm_head": False, "meta": {"quantizer": ["gptqmodel:1.0"]}, "quant_method": "gptq",
                 "static_groups": False, "sym": True, "true_sequential": True}
    autogptq = {"bits": 8, "group_size": -1, "damp_percent": 0.01, "desc_act": False, "static_groups": False,
                "sym": False, "true_sequential": True, "model_name_or_path": None, "model_file_base_name": "model"}
    autoawq = {"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"}
    hf_awq = {"bits": 4, "group_size": 64, "modules_to_not_convert": None, "quant_method": "awq",
              "version": "gemm", "zero_point": True}
    llmc = {"config_groups": {"group_0": {"input_activations": None, "output_activations": None, "targets": ["Linear"],
                                          "weights": {"actorder": "group", "block_structure": None, "dynamic": False,
                                                      "group_size": 128, "num_bits": 4, "observer": "minmax",
                                                      "observer_kwargs": {}, "strategy": "group", "symmetric": True,
                                                      "type": "int"}}},
            "format": "pack-quantized", "global_compression_ratio": 1.89, "ignore": ["lm_head"],
            "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed"}
    assert parse_quantization_config(gptqmodel, "c") == QuantSpec(CF.GPTQ, 4, 128, True, True)
    assert parse_quantization_config(autogptq, "c") == QuantSpec(CF.GPTQ, 8, -1, False, False)
    assert parse_quantization_config(autoawq, "c") == QuantSpec(CF.AWQ, 4, 128, False, False)
    assert parse_quantization_config(hf_awq, "c") == QuantSpec(CF.AWQ, 4, 64, False, False)
    assert parse_quantization_config(llmc, "c") == QuantSpec(CF.COMPRESSED_TENSORS, 4, 128, True, True, ("lm_head",))
    llmc["config_groups"]["group_0"]["weights"] |= {"actorder": "weight", "strategy": "channel", "group_size": None}
    assert parse_quantization_config(llmc, "c") == QuantSpec(CF.COMPRESSED_TENSORS, 4, -1, True, False, ("lm_head",))


def ct(**weights) -> dict:
    w = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128} | weights
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w}}}


@pytest.mark.parametrize("cfg,message", [
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "gptq with 3 bits: Ember's kernels take 4 and 8"),
    ({"quant_method": "gptq", "bits": 2, "group_size": 128, "checkpoint_format": "gptq_v2"}, "take 4 and 8"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"},
     "checkpoint_format 'marlin'"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "AWQ version 'gemv'"),
    ({"quant_method": "awq", "bits": 8, "group_size": 128, "version": "gemm"}, "4-bit only"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": False}, "zero_point false"),
    (ct() | {"format": "float-quantized"}, "format 'float-quantized'"),
    (ct(num_bits=3), "take 4 and 8"),
    (ct(strategy="tensor"), "strategy 'tensor'"),
    (ct(type="float"), "type 'float'"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {}}, "no scheme"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method 'bitsandbytes'"),
    ({"quant_method": "gptq", "bits": "four", "group_size": 128}, "must be integers"),
])
def test_bad_configs(cfg, message):
    with pytest.raises(CheckpointError, match=f"^/m/config.json: quantization_config: .*{message}"):
        parse_quantization_config(cfg, "/m/config.json")


def test_config_writer_refuses_what_awq_cannot_say():
    with pytest.raises(CheckpointError, match="AWQ"):
        quantization_config(spec(CF.AWQ, sym=True))


def test_written_configs_keep_the_head_dense():
    """`ember quantize` leaves lm_head dense; each format must say so in its own way."""
    gptq, awq, ct_cfg = (quantization_config(QuantSpec(f, 4, 128, f is CF.GPTQ, False))
                         for f in (CF.GPTQ, CF.AWQ, CF.COMPRESSED_TENSORS))
    assert gptq["lm_head"] is False and gptq["checkpoint_format"] == "gptq"
    assert awq["modules_to_not_convert"] is None and awq["version"] == "gemm"
    assert ct_cfg["ignore"] == ["lm_head"] and ct_cfg["format"] == "pack-quantized"
    assert parse_quantization_config(ct_cfg, "c").ignore == ("lm_head",)


# ---- on disk ----

@pytest.mark.parametrize("fmt,bits,sym,desc_act", [(CF.GPTQ, 4, False, True), (CF.GPTQ_V2, 8, True, False),
                                                   (CF.AWQ, 4, False, False), (CF.COMPRESSED_TENSORS, 4, False, True),
                                                   (CF.COMPRESSED_TENSORS, 8, True, False)])
def test_safetensors_round_trip(tmp_path, fmt, bits, sym, desc_act):
    module, N, K = "model.layers.0.self_attn.q_proj", 32, 128
    sp = spec(fmt, bits, 32, sym=sym, desc_act=desc_act)
    w = weight(N, K, bits, 32, sym=sym, act_order=desc_act, seed=11)
    save_file({f"{module}.{k}": v for k, v in encode_linear(w, sp).items()}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": quantization_config(sp)}))
    read = parse_quantization_config(json.loads((tmp_path / "config.json").read_text())["quantization_config"],
                                     str(tmp_path / "config.json"))
    assert read == sp
    with safe_open(tmp_path / "model.safetensors", framework="pt") as f:
        tensors = {s: f.get_tensor(f"{module}.{s}") for s in tensor_names(read) if f"{module}.{s}" in f.keys()}
    back = decode_linear(tensors, read, (N, K), f"{tmp_path}: {module}")
    same(back, w)
    assert torch.equal(back.dequantize(), w.dequantize())
