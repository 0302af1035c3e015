"""read_model_config / load_model on tiny files and on the bundled SmolLM2 file."""
from __future__ import annotations

import shutil
import time

import numpy as np
import pytest
import torch

from engine.layers.rope_scaling import RopeScaling
from engine.loaders.gguf_config import read_model_config
from engine.loaders.gguf_loader import load_model, unpermute_rows
from engine.model_files.families import FAMILIES
from engine.models.config import ModelConfig


def test_config_from_metadata(tiny_model_factory):
    cfg = read_model_config(tiny_model_factory(arch="qwen2", hidden=96, n_heads=6, n_kv_heads=2, ffn=160,
                                               n_layers=3, ctx=256, rope_theta=5e4, tied=True))
    assert cfg == ModelConfig(family=FAMILIES["qwen2"], vocab_size=cfg.vocab_size, hidden_size=96,
                              intermediate_size=160, num_layers=3, num_heads=6, num_kv_heads=2, head_dim=16,
                              rms_norm_eps=cfg.rms_norm_eps, rope_theta=5e4, rope_scaling=None, context_length=256,
                              tie_word_embeddings=True, attention_bias=True)
    assert abs(cfg.rms_norm_eps - 1e-5) < 1e-9 and cfg.vocab_size > 256


def test_config_ignores_file_name(tiny_model_factory, tmp_path):
    src = tiny_model_factory(arch="llama")
    liar = tmp_path / "Qwen2-7B-Instruct-Q4_K_M.gguf"
    shutil.copy(src, liar)
    assert read_model_config(liar) == read_model_config(src)
    assert read_model_config(liar).arch == "llama" and not read_model_config(liar).attention_bias


def test_linear_rope_scaling_read(tiny_model_factory):
    cfg = read_model_config(tiny_model_factory(rope_scaling=("linear", 2.0)))
    assert cfg.rope_scaling == RopeScaling("linear", 2.0, 512)


def test_unpermute_inverts_the_converters_permute():
    """convert_hf_to_gguf.py LlamaModel.permute, verbatim, then ours: identity on weights and biases."""
    def permute(w, n_head):
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    rng = np.random.default_rng(0)
    for n_head, hd in [(4, 16), (3, 64), (1, 8)]:
        w = rng.standard_normal((n_head * hd, 24)).astype(np.float32)
        b = rng.standard_normal(n_head * hd).astype(np.float32)
        assert np.array_equal(unpermute_rows(torch.from_numpy(permute(w, n_head)), n_head).numpy(), w)
        assert np.array_equal(unpermute_rows(torch.from_numpy(permute(b, n_head)), n_head).numpy(), b)


def test_fused_weights_and_tied_head(tiny_model_factory):
    model = load_model(tiny_model_factory(arch="qwen2", tied=True), torch.bfloat16)
    cfg = model.config
    layer = model.layers[0]
    assert layer.self_attn.qkv_proj.weight.shape == (cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size)
    assert layer.self_attn.qkv_proj.bias.shape == (cfg.q_size + 2 * cfg.kv_size,)
    assert layer.mlp.gate_up_proj.weight.shape == (2 * cfg.intermediate_size, cfg.hidden_size)
    # A dense (bf16) tied head reads the embedding table itself: one copy in memory.
    assert model.lm_head.weight.data_ptr() == model.embed_tokens.data_ptr() and model.dtype == torch.bfloat16
    assert not any(p.requires_grad for p in model.parameters())


def test_float32_cpu_linears_are_packed_and_batch_invariant(tiny_model_factory):
    """fp32 on CPU goes through oneDNN-packed weights: same logits as a float64 product of the
    plain weights, and each row's bits do not depend on how many rows share the GEMM."""
    from engine.layers.linear import PackedLinear, packed_linear_available
    from engine.layers.make_linear import make_linear

    model = load_model(tiny_model_factory(tied=True), torch.float32)
    if not packed_linear_available(model.embed_tokens):
        pytest.skip("this torch build has no oneDNN")
    assert isinstance(model.layers[0].self_attn.qkv_proj, PackedLinear)
    assert isinstance(model.lm_head, PackedLinear)
    g = torch.Generator().manual_seed(0)
    w, b, x = (torch.randn(96, 64, generator=g), torch.randn(96, generator=g), torch.randn(33, 64, generator=g))
    lin = make_linear(w.clone(), b.clone())
    assert isinstance(lin, PackedLinear)
    y = lin(x)
    torch.testing.assert_close(y.double(), x.double() @ w.double().T + b.double(), rtol=0, atol=1e-4)
    for m in (1, 2, 7, 16):
        assert torch.equal(lin(x[:m]), y[:m])
    assert lin(x[:0]).shape == (0, 96)


@pytest.mark.slow
def test_bundled_model_config_and_load_time(bundled_model_path):
    cfg = read_model_config(bundled_model_path)
    assert (cfg.arch, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size,
            cfg.hidden_size, cfg.tie_word_embeddings, cfg.rope_theta) == \
        ("llama", 30, 9, 3, 64, 49152, 576, True, 100000.0)
    t0 = time.perf_counter()
    model = load_model(bundled_model_path, torch.bfloat16)
    elapsed = time.perf_counter() - t0
    print(f"bundled model load (bf16): {elapsed:.2f} s")
    assert elapsed < 10
    assert sum(p.numel() for p in model.parameters()) > 130e6


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_factory_models_load_in_llama_cpp(tiny_model_factory, arch):
    """The tiny files are real GGUF models to llama.cpp: vocab-only and full loads, BPE merges and
    ChatML specials tokenize, and the text round-trips."""
    import llama_cpp

    from gguf_factory import IM_END_ID, IM_START_ID

    path = tiny_model_factory(arch=arch)
    vocab = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    text = "<|im_start|>user\nHello, world! Über 🙂   spaces\tand\ncode()<|im_end|>"
    ids = vocab.tokenize(text.encode(), add_bos=False, special=True)
    assert ids[0] == IM_START_ID and ids[-1] == IM_END_ID
    assert len(ids) < len(text.encode())  # merges apply
    assert vocab.detokenize(ids, special=True).decode() == text
    full = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_threads=1, verbose=False)
    assert full.n_vocab() == read_model_config(path).vocab_size
    assert len(full.create_completion("Hello", max_tokens=4, temperature=0)["choices"][0]["text"]) > 0
