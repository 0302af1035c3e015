"""`ember bench gemm`: it times every quantized matrix of the real bundled model, once each per pass,
and counts exactly the bytes those matrices hold (speed printed, never judged)."""
from __future__ import annotations

import re

import pytest

from engine.kernels import kernels

pytestmark = pytest.mark.skipif(kernels() is None, reason="Ember's CPU kernels are not built")


def test_every_quantized_matrix_is_timed_and_its_bytes_counted():
    from app.bench.gemm import matrices, packed_bytes, time_kinds
    from engine.backends import load_engine
    from engine.config import EngineConfig
    from engine.layers.quant_linear import QuantLinear
    from engine.model_files.bundled import default_model_path

    engine, _ = load_engine(EngineConfig(model_path=str(default_model_path()), num_threads=1), "torch", "cpu")
    model = engine.runner.model
    kinds = matrices(model)
    assert [len(v) for v in kinds.values()] == [len(model.layers)] * 4 + [1]  # and the (tied) head
    every = {id(m) for m in model.modules() if isinstance(m, QuantLinear)}
    assert {id(lin) for v in kinds.values() for lin in v} == every
    timings, read = time_kinds(kinds, rows=2, repeats=1)
    assert [t.kind for t in timings] == ["qkv", "o", "gate_up", "down", "head"]
    assert sum(t.nbytes for t in timings) == sum(packed_bytes(m) for m in model.modules() if isinstance(m, QuantLinear))
    # the tiles hold the file's 4.5-6.5 bits a weight: bytes within a few percent of bits/8 a weight
    for t, lins in zip(timings, kinds.values()):
        weights = sum(lin.in_features * lin.out_features for lin in lins)
        assert weights * 4 / 8 <= t.nbytes <= weights * (t.bits + 1.5) / 8
    assert read > 0 and all(t.seconds > 0 for t in timings)


def test_a_mixture_of_experts_times_every_expert(tmp_path):
    from gguf import GGMLQuantizationType as QT

    from app.bench.gemm import matrices
    from arch_ggufs import write_arch_gguf
    from engine.layers.quant_linear import QuantLinear
    from engine.loaders.gguf_loader import load_model

    path = tmp_path / "moe.gguf"
    write_arch_gguf(path, "qwen3moe", qtype=QT.Q8_0)
    model = load_model(path, quantized=True)
    kinds = matrices(model)
    assert [len(kinds[k]) for k in ("qkv", "o", "gate_up", "down")] == [2, 2, 2 * 4, 2 * 4]  # 2 layers, 4 experts
    experts = [lin for layer in model.layers for lin in (*layer.mlp.gate_up, *layer.mlp.down)]
    assert all(isinstance(lin, QuantLinear) for lin in experts)
    assert {id(lin) for lin in kinds["gate_up"] + kinds["down"]} == {id(lin) for lin in experts}


def test_cli_prints_a_row_per_kind_and_the_plain_read(capsys):
    from app.cli import main

    assert main(["bench", "gemm", "--repeats", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    for kind in ("qkv", "o", "gate_up", "down", "head", "all", "sum()"):
        assert re.search(rf"^{re.escape(kind)}\s", out, re.M), (kind, out)
    assert re.search(r"kernels / plain read: [0-9.]+x", out)
    assert re.search(r"^matrices.*in cache$", out, re.M)
    assert re.search(r"^in cache: ", out, re.M)


def test_cached_rate_takes_the_matrices_that_fit():
    from app.bench.gemm import cache_bytes, cached_rate, matrices, packed_bytes
    from engine.backends import load_engine
    from engine.config import EngineConfig
    from engine.model_files.bundled import default_model_path

    engine, _ = load_engine(EngineConfig(model_path=str(default_model_path()), num_threads=1), "torch", "cpu")
    qkv = matrices(engine.runner.model)["qkv"]
    assert cached_rate(qkv, rows=1, budget=packed_bytes(qkv[0]) - 1, repeats=1) is None
    assert cached_rate(qkv, rows=1, budget=packed_bytes(qkv[0]), repeats=1) > 0
    assert cache_bytes(index=99) == 0  # no such level: unknown, not an error
