"""Hugging Face GPTQ / AWQ / compressed-tensors directories (engine/loaders/hf_loader.py) made by
`ember quantize`'s pipeline from tiny GGUF models, loaded back.

Oracles, none of them the loader's own code: the IntWeights the quantizer handed to the writer
(captured through quantize_model's on_layer; IntWeight.dequantize is w = s (q - z), the shared
definition), float16 rounding of the dense tensors (what every GPTQ/AWQ checkpoint stores), and
gguf-py's own dequantize for the source GGUF's embedding and head. The kernel path is held to
the dense path within what int8 activations cost (see KERNEL_TOLERANCE), and every linear to the
same bits on all CPU code paths. Bad checkpoints must fail with a CheckpointError that names the file
and the problem.
"""
from __future__ import annotations

import inspect
import json
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize
from model_oracles import our_logits
from safetensors.torch import load_file, save_file

from engine.kernels import available_paths, kernels
from engine.layers.linear import DenseLinear, PackedLinear
from engine.loaders.hf_loader import load_hf_model
from engine.loaders.load import load_model
from engine.model_files.errors import ModelFileError
from engine.model_files.quant_config import CheckpointError, CheckpointFormat as CF
from engine.quant.pipeline import LayerResult, quantize_model
from engine.quant.quantize_config import Method, QuantizeConfig
from engine.quant.source import open_source
from engine.quant.writer import CheckpointWriter

# our fused linear -> the Hugging Face modules it is made of, in row order
PARTS = {"qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o_proj": ("self_attn.o_proj",),
         "gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"), "down_proj": ("mlp.down_proj",)}
# llama: no GQA (AWQ then folds o_proj's scales into v_proj), Q8_0 weights, own head;
# qwen2: GQA 2:1, q/k/v biases, float16 weights, tied head. hidden/ffn multiples of 128.
MODELS = {"llama": dict(arch="llama", hidden=128, ffn=256, n_heads=4, n_kv_heads=4, qtype=QT.Q8_0, seed=1),
          "qwen2": dict(arch="qwen2", hidden=128, ffn=256, n_heads=4, n_kv_heads=2, qtype=QT.F16, tied=True, seed=2)}


@dataclass(frozen=True)
class Case:
    arch: str
    format: str
    method: str
    bits: int = 4
    group: int = 128
    sym: bool = False
    desc_act: bool = False
    static: bool = False

    @property
    def id(self) -> str:
        act = ("-act-static" if self.static else "-act") if self.desc_act else ""
        return (f"{self.arch}-{self.format}-{self.method}-w{self.bits}g{self.group}-"
                f"{'sym' if self.sym else 'asym'}{act}")


# every format x every method on both archs; bits, group sizes, sym and act-order spread over them
CASES = [
    Case("llama", "gptq", "rtn", 4, 128, sym=True),
    Case("llama", "gptq", "gptq", 4, 32, desc_act=True),  # asymmetric v1: zero points of 0 borrow
    Case("llama", "gptq", "awq", 4, 64),
    Case("llama", "gptq_v2", "rtn", 8, -1),
    Case("llama", "gptq_v2", "gptq", 8, 64, sym=True, desc_act=True, static=True),
    Case("llama", "gptq_v2", "awq", 4, 128, sym=True),
    Case("llama", "awq", "rtn", 4, 32),
    Case("llama", "awq", "gptq", 4, -1),
    Case("llama", "awq", "awq", 4, 128),
    Case("llama", "compressed-tensors", "rtn", 4, 64, sym=True),
    Case("llama", "compressed-tensors", "gptq", 4, 128, desc_act=True),
    Case("llama", "compressed-tensors", "awq", 8, 32),
    Case("qwen2", "gptq", "rtn", 8, 32),
    Case("qwen2", "gptq", "gptq", 4, 128, sym=True, desc_act=True, static=True),
    Case("qwen2", "gptq", "awq", 4, -1, sym=True),
    Case("qwen2", "gptq_v2", "rtn", 4, 64),
    Case("qwen2", "gptq_v2", "gptq", 4, 32, desc_act=True),
    Case("qwen2", "gptq_v2", "awq", 8, 128),
    Case("qwen2", "awq", "rtn", 4, 128),
    Case("qwen2", "awq", "gptq", 4, 32),
    Case("qwen2", "awq", "awq", 4, 64),
    Case("qwen2", "compressed-tensors", "rtn", 4, -1),
    Case("qwen2", "compressed-tensors", "gptq", 8, 32, sym=True, desc_act=True),
    Case("qwen2", "compressed-tensors", "awq", 4, 32, sym=True),
]
PROMPT = list(range(3, 3 + 24))  # token ids; the tiny vocabulary has ~460


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The machine is shared: one thread is 10x faster than two that wait for each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def calibration(tmp_path_factory) -> Path:
    """A short text (stdlib source, as the default calibration is): tokenizing the default 1 MB
    would take longer than quantizing these models."""
    path = tmp_path_factory.mktemp("cal") / "calibration.txt"
    path.write_text(inspect.getsource(textwrap)[:6000], encoding="utf-8")
    return path


@dataclass
class Made:
    out: Path
    gguf: Path
    results: dict[int, LayerResult]


def quantize_to(gguf: Path, out: Path, cfg: QuantizeConfig) -> dict[int, LayerResult]:
    """quantize_model into a CheckpointWriter, keeping each layer's LayerResult as written."""
    src = open_source(gguf)
    writer = CheckpointWriter(out, src, cfg.spec)
    results: dict[int, LayerResult] = {}

    def on_layer(i: int, r: LayerResult) -> None:
        results[i] = r
        writer.add_layer(i, r)

    try:
        quantize_model(src, cfg, on_layer)
        writer.finish()
    finally:
        src.close()
    return results


@pytest.fixture(scope="module")
def made(tiny_model_factory, tmp_path_factory, calibration):
    cache: dict[Case, Made] = {}

    def make(case: Case) -> Made:
        if case not in cache:
            gguf = tiny_model_factory(**MODELS[case.arch])
            cfg = QuantizeConfig(method=Method(case.method), bits=case.bits, group_size=case.group, sym=case.sym,
                                 desc_act=case.desc_act, static_groups=case.static, format=CF(case.format),
                                 calibration=calibration, num_samples=3, seq_len=48)
            out = tmp_path_factory.mktemp("q") / case.id
            cache[case] = Made(out, gguf, quantize_to(gguf, out, cfg))
        return cache[case]

    return make


def dense_weight(lin) -> torch.Tensor:
    """W [out, in] of a float linear. A PackedLinear holds it in oneDNN's blocked layout, so it is
    read back through that GEMM on the identity, without the bias: every output is 1 w plus
    exact zeros, so the values come back bit for bit."""
    if isinstance(lin, DenseLinear):
        return lin.weight.float()
    assert isinstance(lin, PackedLinear), type(lin)
    eye = torch.eye(lin.in_features)
    return torch.ops.mkldnn._linear_pointwise(eye, lin.weight, None, "none", [], "").T


def gguf_tensor(path: Path, name: str) -> torch.Tensor:
    """float32 tensor as gguf-py dequantizes it (the oracle for every block type)."""
    t = next(t for t in GGUFReader(str(path)).tensors if t.name == name)
    return torch.from_numpy(np.array(gguf_dequantize(t.data, t.tensor_type), dtype=np.float32))


def contiguous(w) -> bool:
    """The IntWeight's groups are k // G (or one group): no permutation needed."""
    K = w.shape[1]
    return w.group_size == -1 or torch.equal(w.groups(), torch.arange(K) // w.group_size)


def fp16(t: torch.Tensor) -> torch.Tensor:
    return t.half().float()


# ---- 1. exactness of the round trip ----

@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_dense_load_is_exactly_what_was_quantized(made, case):
    m = made(case)
    model = load_hf_model(m.out, torch.float32, quantized=False)
    cfg = model.config
    assert (cfg.arch, cfg.num_layers, cfg.hidden_size) == (case.arch, 2, 128)
    for i, layer in enumerate(model.layers):
        r = m.results[i]
        lins = {"qkv_proj": layer.self_attn.qkv_proj, "o_proj": layer.self_attn.o_proj,
                "gate_up_proj": layer.mlp.gate_up_proj, "down_proj": layer.mlp.down_proj}
        for name, modules in PARTS.items():
            ws = [r.weights[mod] for mod in modules]
            assert all((w.bits, w.group_size) == (case.bits, case.group) for w in ws)
            want = torch.cat([w.dequantize() for w in ws])
            got = dense_weight(lins[name])
            assert got.shape == want.shape and torch.equal(got, want), f"layer {i} {name}"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            assert torch.equal(getattr(layer, norm).weight, fp16(r.dense[f"{norm}.weight"])), f"layer {i} {norm}"
        bias = layer.self_attn.qkv_proj.bias
        if case.arch == "qwen2":
            want = fp16(torch.cat([r.dense[f"{mod}.bias"] for mod in PARTS["qkv_proj"]]))
            assert torch.equal(bias, want)
        else:
            assert bias is None
    permuted = [not contiguous(w) for r in m.results.values() for w in r.weights.values()]
    # act-order really is in the file (permuted groups); static groups: act-order during GPTQ
    # only, groups in column order
    assert any(permuted) == (case.desc_act and not case.static and case.group != -1)
    embd = fp16(gguf_tensor(m.gguf, "token_embd.weight"))
    assert torch.equal(model.embed_tokens, embd)
    head = embd if case.arch == "qwen2" else fp16(gguf_tensor(m.gguf, "output.weight"))
    assert torch.equal(dense_weight(model.lm_head), head)
    assert torch.equal(model.norm.weight, fp16(gguf_tensor(m.gguf, "output_norm.weight")))


def test_load_model_dispatches_a_directory(made):
    """The runner's one entry (engine/loaders/load.py) takes the directory like a GGUF file."""
    m = made(CASES[0])
    a, b = load_model(m.out, torch.float32, "cpu"), load_hf_model(m.out, torch.float32)
    assert torch.equal(our_logits(a, PROMPT), our_logits(b, PROMPT))


# ---- 2. the kernel path ----

EPS32 = torch.finfo(torch.float32).eps


def int8_bound(lin, w, x: torch.Tensor) -> torch.Tensor:
    """How far the kernels' y may be from x W^T (float64, W = w.dequantize()) for one QuantLinear.

    tests/kernels/test_qlinear.py: the op rounds x to int8 per row and block of 32 (in the layer's
    permuted column order when it has one), s = amax/127 rounded to float16, so each x_k is off by
    at most (1/2 + 127 2^-11) s_b(k): |dy| <= (1/2 + 127 2^-11) sum_k |w_k| s_b(k). The tiles
    also hold the group offset m (4-bit: -s z; 8-bit: s (128 - z)) rounded to float16, off by at
    most 2^-11 |m| per weight (engine/weights/int_weight.py), and the float32 epilogue adds a few
    eps32 per group of 32 of sum |x| |w|."""
    M, K = x.shape
    perm = torch.arange(K) if lin.perm is None else lin.perm
    s_perm = x[:, perm].view(M, -1, 32).abs().amax(-1) / 127
    s_col = torch.empty(M, K, dtype=torch.float64)
    s_col[:, perm] = s_perm.double().repeat_interleave(32, 1)
    g = w.groups()
    z = w.zeros[:, g].double()
    m_col = w.scales[:, g].double() * (z if w.bits == 4 else (128 - z).abs())
    W = w.dequantize().double().abs()
    ax = x.double().abs()
    return ((0.5 + 127 * 2.0 ** -11) * (1 + 1e-3) * s_col @ W.T + 2.0 ** -11 * ax @ m_col.T
            + (2 * K // 32 + 8) * EPS32 * ax @ (W + m_col).T)


@pytest.mark.skipif(kernels() is None, reason="Ember's CPU kernels are not built")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_quantized_linear_is_the_captured_weight_within_int8_rounding(made, case, monkeypatch):
    """Each layer's QuantLinear against the IntWeights the quantizer produced (float64 x W^T + b),
    on every CPU path, within the int8-activation bound: a wrong nibble, zero point, group,
    permutation or row order is off by a whole term, far outside it."""
    m = made(case)
    gen = torch.Generator().manual_seed(7)
    for path in PATHS:
        monkeypatch.setenv("EMBER_CPU_PATH", path.name.lower())
        model = load_hf_model(m.out, torch.float32, quantized=True)
        for i, layer in enumerate(model.layers):
            r = m.results[i]
            lins = {"qkv_proj": layer.self_attn.qkv_proj, "o_proj": layer.self_attn.o_proj,
                    "gate_up_proj": layer.mlp.gate_up_proj, "down_proj": layer.mlp.down_proj}
            for name, modules in PARTS.items():
                lin, ws = lins[name], [r.weights[mod] for mod in modules]
                x = torch.randn(7, lin.in_features, generator=gen) * torch.rand(7, 1, generator=gen).add(0.1)
                x[3, :32] *= 50  # an outlier block
                with torch.inference_mode():
                    y = lin(x).double()
                ref = torch.cat([x.double() @ w.dequantize().double().T for w in ws], dim=1)
                if lin.bias is not None:
                    ref = ref + fp16(torch.cat([r.dense[f"{mod}.bias"] for mod in modules])).double()
                bound = torch.cat([int8_bound(lin, w, x) for w in ws], dim=1)
                err = (y - ref).abs()
                assert (err <= bound).all(), (f"{path.name} layer {i} {name}: worst err/bound "
                                              f"{(err / bound).max():.3g}")
                assert (err / bound).max() > 0.01  # the bound is not vacuous: int8 rounding shows


# Dense vs kernel logits. The kernels quantize every activation row to int8 per 32 values, so
# each matmul is off by at most (1/2 + 127 2^-11) sum_k |w_k| s_b(k) (tests/kernels/test_qlinear.py),
# with s_b = amax/127 of the block: about 1/254 of sum |w| |x|, under 1% of |y| for these
# Gaussian-like rows. The kernel head is in addition rounded to 8 bits per 32 (as llama.cpp
# keeps a GGUF's output at Q8_0): weight errors of at most amax/254 per value. Two layers of
# four matmuls, the head and RoPE/softmax in between: a few percent of the logits' spread at
# most; 5% leaves room without hiding a real fault (a wrong group, nibble, zero point or
# permutation moves the logits by tens of percent).
KERNEL_TOLERANCE = 0.05
PATHS = available_paths()


@pytest.mark.skipif(kernels() is None, reason="Ember's CPU kernels are not built")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_kernel_path_agrees_with_the_dense_path(made, case, monkeypatch):
    from engine.layers.quant_linear import QuantLinear

    m = made(case)
    dense = our_logits(load_hf_model(m.out, torch.float32, quantized=False), PROMPT)
    act_order = case.desc_act and not case.static
    by_path = {}
    for path in PATHS:
        monkeypatch.setenv("EMBER_CPU_PATH", path.name.lower())
        model = load_hf_model(m.out, torch.float32, quantized=True)
        lins = [lin for layer in model.layers for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                           layer.mlp.gate_up_proj, layer.mlp.down_proj)]
        assert all(isinstance(lin, QuantLinear) and lin.path == path for lin in lins)
        assert {lin.bits for lin in lins} == {case.bits}
        assert isinstance(model.lm_head, QuantLinear) and model.lm_head.bits == 8
        if act_order:
            assert any(lin.perm is not None for lin in lins) and model.stack is None
        else:
            assert all(lin.perm is None for lin in lins) and model.stack is not None
        logits = our_logits(model, PROMPT)
        err = (logits - dense).norm() / (dense - dense.mean(-1, keepdim=True)).norm()
        assert err <= KERNEL_TOLERANCE, f"{path.name}: relative logit error {err:.4f}"
        g = torch.Generator().manual_seed(0)
        by_path[path] = [lin(torch.randn(5, lin.in_features, generator=g)) for lin in lins + [model.lm_head]]
    # Every code path gives each linear the same bits. (Not the logits: the stack's paged
    # attention sums in another order on AVX2 than on AVX-512, paged_attention.cpp, and an
    # int8 activation code can round the other way downstream.)
    first = by_path[PATHS[0]]
    for path, outs in by_path.items():
        assert all(torch.equal(y, y0) for y, y0 in zip(outs, first)), f"{path.name} != {PATHS[0].name}"


# ---- 3. bad input ----

@pytest.fixture(scope="module")
def good(made) -> Path:
    """A 4-bit g32 GPTQ v1 llama checkpoint, split into two shards with an index."""
    case = Case("llama", "gptq", "rtn", 4, 32, sym=True)
    src = made(case).out
    out = src.with_name(src.name + "-sharded")
    shutil.copytree(src, out)
    tensors = load_file(str(out / "model.safetensors"))
    (out / "model.safetensors").unlink()
    first = {k: v for k, v in tensors.items() if k.startswith(("model.embed_tokens", "model.layers.0."))}
    shards = {"model-00001-of-00002.safetensors": first,
              "model-00002-of-00002.safetensors": {k: v for k, v in tensors.items() if k not in first}}
    for name, part in shards.items():
        save_file(part, str(out / name), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: name for name, part in shards.items() for k in part}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return out


def test_sharded_checkpoint_loads_like_one_file(good, made):
    whole = load_hf_model(made(Case("llama", "gptq", "rtn", 4, 32, sym=True)).out)
    assert torch.equal(our_logits(load_hf_model(good), PROMPT), our_logits(whole, PROMPT))


SHARD1, SHARD2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def edit_config(d: Path, change) -> None:
    cfg = json.loads((d / "config.json").read_text())
    change(cfg)
    (d / "config.json").write_text(json.dumps(cfg))


def edit_shard(d: Path, shard: str, change) -> None:
    tensors = load_file(str(d / shard))
    change(tensors)
    save_file(tensors, str(d / shard), metadata={"format": "pt"})


def truncate(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def garble_header(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[8:40] = b"\xff" * 32  # inside the JSON header
    p.write_bytes(bytes(data))


def qweight_wrong_k(t: dict) -> None:
    name = "model.layers.0.self_attn.o_proj.qweight"
    t[name] = torch.cat([t[name], t[name]])  # [2 K/8, N]: the words of K = 256, not 128


def ct_float(cfg: dict) -> None:
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": "float-quantized",
                                  "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                                      "num_bits": 8, "type": "float", "strategy": "channel"}}}}


def qc(**kw):
    return lambda cfg: cfg["quantization_config"].update(kw)


# (id, how to break the checkpoint, the file the message must name, what it must say)
BAD = [
    ("missing-shard", lambda d: (d / SHARD2).unlink(), SHARD2, "missing shard"),
    ("truncated-shard", lambda d: truncate(d / SHARD1), SHARD1, "not a readable safetensors file"),
    ("corrupt-header", lambda d: garble_header(d / SHARD2), SHARD2, "not a readable safetensors file"),
    ("missing-qzeros", lambda d: edit_shard(d, SHARD2, lambda t: t.pop("model.layers.1.self_attn.k_proj.qzeros")),
     SHARD2, "'qzeros' is missing"),
    ("missing-qweight", lambda d: edit_shard(d, SHARD2, lambda t: t.pop("model.layers.1.mlp.up_proj.qweight")),
     SHARD2, "'qweight' is missing"),
    ("qweight-wrong-k", lambda d: edit_shard(d, SHARD1, qweight_wrong_k), SHARD1, "'qweight' has shape [32, 128]"),
    ("hidden-size", lambda d: edit_config(d, lambda c: c.update(hidden_size=96)), SHARD1, "config.json implies"),
    ("more-layers", lambda d: edit_config(d, lambda c: c.update(num_hidden_layers=3)), "", "model.layers.2."),
    ("vocab-size", lambda d: edit_config(d, lambda c: c.update(vocab_size=1000)), SHARD1, "config.json implies"),
    ("bits-8-for-4", lambda d: edit_config(d, qc(bits=8)), SHARD1, "'qweight' has shape [16, 128], expected [32, 128]"),
    ("bits-3", lambda d: edit_config(d, qc(bits=3)), "config.json", "3 bits"),
    ("awq-gemv", lambda d: edit_config(d, lambda c: c.update(quantization_config={
        "quant_method": "awq", "version": "gemv", "bits": 4, "group_size": 32, "zero_point": True})),
     "config.json", "AWQ version 'gemv'"),
    ("gptq-marlin", lambda d: edit_config(d, qc(checkpoint_format="marlin")), "config.json", "'marlin'"),
    ("ct-float", lambda d: edit_config(d, ct_float), "config.json", "'float-quantized'"),
    ("model-type", lambda d: edit_config(d, lambda c: c.update(model_type="mamba")), "config.json",
     "unsupported model_type 'mamba'"),
    ("tensor-in-two-shards", lambda d: edit_shard(d, SHARD1, lambda t: t.update(
        {"model.norm.weight": load_file(str(d / SHARD2))["model.norm.weight"]})), SHARD2, "also in"),
]


@pytest.mark.parametrize("breaks,file,problem", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_checkpoint_names_the_file_and_the_problem(good, tmp_path, breaks, file, problem):
    d = tmp_path / "ckpt"
    shutil.copytree(good, d)
    breaks(d)
    with pytest.raises(CheckpointError) as e:
        load_hf_model(d, torch.float32, quantized=False)
    assert isinstance(e.value, ModelFileError)
    msg = str(e.value)
    assert str(d / file) in msg and problem in msg, msg


@pytest.mark.slow
def test_serve_on_a_broken_checkpoint_says_why(good, tmp_path):
    """`ember serve --model DIR` on a checkpoint with a missing shard fails at start with the message."""
    from server_util import start_engine

    d = tmp_path / "ckpt"
    shutil.copytree(good, d)
    (d / SHARD2).unlink()
    with pytest.raises(RuntimeError) as e:
        start_engine(d, tmp_path).stop()
    msg = str(e.value)
    assert str(d / SHARD2) in msg and "missing shard" in msg, msg
