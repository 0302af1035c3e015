"""Fidelity of the quantized torch engine (weights kept 4/8-bit, int8 activations, Ember's CPU
kernels) against llama.cpp on the same files, with the bars of tests/engine/test_fidelity.py: llama.cpp
also quantizes activations to 8 bits per 32 values, so the two should agree as llama.cpp's own
builds agree with each other. Run on the path this CPU uses (all paths give the same bits:
tests/kernels/test_qlinear.py).
"""
from __future__ import annotations

import pytest
import torch

from engine.kernels import kernels
from engine.loaders.gguf_loader import load_model
from engine.layers.quant_linear import QuantLinear
from model_oracles import (agreement, assert_agrees, assert_departures_are_near_ties, format_summary,
                           greedy_chat_departures, llama_cpp_corpus_logits, our_logits, summarize)
from test_fidelity import qwen_05b_llama_cpp_logits

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def quantized(bundled_model_path):
    assert kernels() is not None, "Ember's CPU kernels did not load: run `make install`"
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    model = load_model(bundled_model_path, torch.float32, "cpu", quantized=True)
    yield model
    torch.set_num_threads(threads)


def test_every_matrix_is_quantized_and_the_stack_runs(quantized):
    lins = [quantized.lm_head] + [m for layer in quantized.layers for m in layer.modules()
                                  if isinstance(m, torch.nn.Module) and hasattr(m, "in_features")]
    assert all(isinstance(m, QuantLinear) for m in lins)
    assert quantized.embed_tokens is None and quantized.stack is not None  # tied table: the head's rows
    assert {m.bits for m in lins} == {4, 8}  # Q4_1 layers, Q8_0 head


def test_quantized_vs_llama_cpp(bundled_model_path, quantized, computed_once):
    oracle = computed_once("bundled-llama-cpp-corpus", lambda: llama_cpp_corpus_logits(bundled_model_path))
    parts = [agreement(our_logits(quantized, c)[:-1], theirs[:-1], torch.tensor(c[1:]))
             for c, theirs in zip(oracle["chunks"], oracle["logits"])]
    f = summarize(parts)
    print("\n" + format_summary("Ember quantized vs llama.cpp", f))
    assert_agrees(f)


def test_quantized_chunked_prefill_gives_the_same_bits(quantized):
    """Every query row attends on its own, so the chunking of a prompt changes nothing."""
    tokens = list(range(1000, 1000 + 200))
    whole = our_logits(quantized, tokens)
    assert torch.equal(whole, our_logits(quantized, tokens, chunk=37))
    assert torch.equal(whole, our_logits(quantized, tokens, chunk=1))


def test_quantized_greedy_chat_departs_only_at_near_ties(bundled_model_path, quantized):
    gaps, report = greedy_chat_departures(bundled_model_path, quantized)
    print("\n" + report)
    assert_departures_are_near_ties(gaps, report)


@pytest.mark.timeout(1800)
def test_qwen2_k_quant_model_quantized_vs_llama_cpp(computed_once):
    """Qwen2.5-Coder-0.5B (Q5_0/Q4_K/Q6_K/Q8_0 mix, q/k/v biases, untied head): mixed formats
    fused into one qkv matrix, 8-bit group-16 Q6_K tiles."""
    path, tokens, theirs = qwen_05b_llama_cpp_logits(computed_once)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = load_model(path, torch.float32, "cpu", quantized=True)
        assert model.stack is not None
        f = summarize([agreement(our_logits(model, tokens)[:-1], theirs, torch.tensor(tokens[1:]))])
    finally:
        torch.set_num_threads(threads)
    print("\n" + format_summary("qwen2 0.5B, Ember quantized vs llama.cpp", f))
    assert_agrees(f)
