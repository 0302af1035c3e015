"""Our LlamaForCausalLM on tiny random GGUF models vs llama.cpp and a float64 dense reference.

Shapes cover GQA ratios 1, 3 and 4, llama (Q/K stored permuted, NORM RoPE in llama.cpp) and
qwen2 (unpermuted, NEOX RoPE, q/k/v biases), tied and separate LM heads, several tensor types.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from engine.loaders.gguf_loader import load_model
from model_oracles import llama_cpp_logits, llama_cpp_model, our_logits, reference_logits

pytestmark = pytest.mark.usefixtures("one_torch_thread")


SHAPES = {  # GQA ratio -> (hidden, n_heads, n_kv_heads); head_dim 16 everywhere
    1: (64, 4, 4),
    3: (96, 6, 2),
    4: (128, 8, 2),
}


def _tokens(n: int, vocab: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab, size=n).tolist()


def _max_rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def _kl(p_logits, q_logits) -> float:
    """Mean over positions of KL(softmax(p) || softmax(q))."""
    lp = torch.from_numpy(np.asarray(p_logits, np.float64)).log_softmax(-1)
    lq = torch.from_numpy(np.asarray(q_logits, np.float64)).log_softmax(-1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("gqa", [1, 3, 4])
def test_matches_llama_cpp_f32(tiny_model_factory, arch, gqa):
    hidden, h, kv = SHAPES[gqa]
    path = tiny_model_factory(arch=arch, hidden=hidden, n_heads=h, n_kv_heads=kv, ffn=2 * hidden,
                              n_layers=2, seed=gqa, tied=(gqa == 3))
    model = load_model(path, torch.float32, "cpu")
    assert model.config.num_heads // model.config.num_kv_heads == gqa
    assert model.config.tie_word_embeddings == (gqa == 3)
    tokens = _tokens(40, model.config.vocab_size, seed=gqa)
    ours = our_logits(model, tokens).numpy()
    theirs = llama_cpp_logits(llama_cpp_model(path, 64), tokens)
    assert _max_rel(ours, theirs) < 1e-4
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    ref = reference_logits(path, tokens).numpy()
    assert _max_rel(ours, ref) < 1e-5


@pytest.mark.parametrize("qtype", [QT.F16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0])
def test_quantized_files_match_reference_and_llama_cpp(tiny_model_factory, qtype):
    """Dequantized weights: exact vs a float64 model over gguf-py's dequantization; llama.cpp
    rounds activations to 8 bits for quantized matmuls, so only close to it."""
    path = tiny_model_factory(arch="llama", hidden=96, n_heads=6, n_kv_heads=2, ffn=192, qtype=qtype, seed=7)
    model = load_model(path, torch.float32, "cpu")
    tokens = _tokens(32, model.config.vocab_size, seed=1)
    ours = our_logits(model, tokens).numpy()
    assert _max_rel(ours, reference_logits(path, tokens).numpy()) < 1e-5
    theirs = llama_cpp_logits(llama_cpp_model(path, 64), tokens)
    # F16 weights: llama.cpp rounds activations to f16; block types: to Q8 blocks (~1.7% of a
    # logit's spread here). The distributions stay within a KL of a few 1e-4.
    assert _max_rel(ours, theirs) < (2e-3 if qtype == QT.F16 else 6e-2)
    assert _kl(theirs, ours) < (1e-5 if qtype == QT.F16 else 2e-3)


def test_k_quant_file_matches_reference(tiny_model_factory):
    path = tiny_model_factory(arch="qwen2", hidden=256, n_heads=4, n_kv_heads=1, ffn=256, qtype=QT.Q4_K,
                              embd_qtype=QT.Q6_K, seed=3)
    model = load_model(path, torch.float32, "cpu")
    tokens = _tokens(24, model.config.vocab_size, seed=2)
    assert _max_rel(our_logits(model, tokens).numpy(), reference_logits(path, tokens).numpy()) < 1e-5


def test_chunked_prefill_equals_one_pass(tiny_model_factory):
    """Prefill in chunks over the paged pool gives the same logits as one pass."""
    path = tiny_model_factory(arch="qwen2", hidden=96, n_heads=6, n_kv_heads=2, ffn=192, seed=5)
    model = load_model(path, torch.float32, "cpu")
    tokens = _tokens(50, model.config.vocab_size, seed=3)
    whole = our_logits(model, tokens)
    for chunk in (1, 7):
        torch.testing.assert_close(our_logits(model, tokens, chunk=chunk), whole, rtol=1e-5, atol=1e-5)


def test_bf16_close_to_f32(tiny_model_factory):
    path = tiny_model_factory(arch="llama", hidden=128, n_heads=8, n_kv_heads=2, ffn=256, seed=4)
    tokens = _tokens(30, load_model(path).config.vocab_size, seed=4)
    f32 = our_logits(load_model(path, torch.float32), tokens)
    bf16 = our_logits(load_model(path, torch.bfloat16), tokens)
    assert _max_rel(bf16, f32) < 3e-2
    assert (bf16.argmax(-1) == f32.argmax(-1)).float().mean() > 0.9


def test_linear_rope_scaling_matches_llama_cpp(tiny_model_factory):
    path = tiny_model_factory(arch="llama", rope_scaling=("linear", 4.0), rope_theta=500.0, seed=9)
    model = load_model(path)
    assert model.config.rope_scaling is not None and model.config.rope_scaling.factor == 4.0
    tokens = _tokens(48, model.config.vocab_size, seed=5)
    theirs = llama_cpp_logits(llama_cpp_model(path, 64), tokens)
    assert _max_rel(our_logits(model, tokens).numpy(), theirs) < 1e-4


def test_llama3_rope_freqs_match_llama_cpp(tiny_model_factory):
    path = tiny_model_factory(arch="llama", rope_freqs=True, rope_theta=500.0, seed=11)
    model = load_model(path)
    assert model.config.rope_freq_factors
    tokens = _tokens(48, model.config.vocab_size, seed=6)
    ours = our_logits(model, tokens).numpy()
    theirs = llama_cpp_logits(llama_cpp_model(path, 64), tokens)
    assert _max_rel(ours, theirs) < 1e-4
    assert _max_rel(ours, reference_logits(path, tokens).numpy()) > 1e-3  # the factors matter
