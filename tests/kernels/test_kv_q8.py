"""The 8-bit KV cache (engine/kernels/csrc/kv_quant.cpp, llama.cpp's q8_0 cache type): rows
quantized as gguf-py quantizes Q8_0 blocks, read back exactly, and the paged-attention kernel
on such a pool against a float64 reference of the values it holds, on every path this CPU has."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from engine.kernels import available_paths, kernels
from engine.kernels.attention import paged_decode
from test_paged_attention_kernel import LENS, make_case, reference, tolerance

pytestmark = pytest.mark.skipif(kernels() is None, reason="Ember's CPU kernels are not built")
PATHS = available_paths() if kernels() is not None else []


def ggml_q8_0(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gguf-py's Q8_0 blocks of x [n, D] (34 bytes per 32: float16 d, then 32 int8 codes) as
    (codes [n, D] int8, scales [n, D/32] float16)."""
    raw = quantize(x.numpy(), QT.Q8_0).reshape(x.shape[0], -1, 34)
    d = torch.from_numpy(raw[..., :2].copy().view(np.float16)[..., 0])
    q = torch.from_numpy(raw[..., 2:].copy().view(np.int8)).reshape(x.shape[0], -1)
    return q, d


def test_rows_are_ggml_q8_0_blocks():
    x = torch.randn(50, 128) * torch.logspace(-3, 2, 50)[:, None]
    x[3] = 0  # an all-zero block: d = 0, codes 0
    rows = kernels().kv_q8(x)
    assert rows.dtype == torch.int8 and rows.shape == (50, 128 + 8)
    q, d = ggml_q8_0(x)
    assert torch.equal(rows[:, :128], q)
    assert torch.equal(rows[:, 128:].contiguous().view(torch.float16), d)
    raw = quantize(x.numpy(), QT.Q8_0)
    assert torch.equal(kernels().kv_q8_dequant(rows), torch.from_numpy(dequantize(raw, QT.Q8_0)))


def q8_case(H: int, n_kv: int, hd: int, seed: int):
    q, k, v, tables, lens = make_case(LENS, H, n_kv, hd, torch.float32, seed=seed)
    return q, kernels().kv_q8(k), kernels().kv_q8(v), tables, lens


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
@pytest.mark.parametrize("H,n_kv,hd", [(4, 4, 64), (9, 3, 64), (12, 3, 128), (8, 2, 128), (4, 1, 32)])
def test_kernel_reads_q8_rows(path, H, n_kv, hd):
    q, k8, v8, tables, lens = q8_case(H, n_kv, hd, seed=hd + H)
    scale = hd ** -0.5
    got = paged_decode(q, k8, v8, tables, lens, scale, path)
    k, v = kernels().kv_q8_dequant(k8), kernels().kv_q8_dequant(v8)  # exact: code x float16 fits float32
    ref, xmax = reference(q, k, v, tables, lens, scale)
    err = (got.double() - ref).abs().max().item()
    assert err <= tolerance(xmax, v), err


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_q8_batch_invariance(path):
    q, k8, v8, tables, lens = q8_case(8, 2, 64, seed=5)
    whole = paged_decode(q, k8, v8, tables, lens, 0.125, path)
    for i in (0, 4, len(LENS) - 1):
        alone = paged_decode(q[i:i + 1], k8, v8, tables[i:i + 1], lens[i:i + 1], 0.125, path)
        assert torch.equal(alone[0], whole[i])


def test_bad_q8_rows_are_refused():
    with pytest.raises(RuntimeError, match="multiple of 32"):
        kernels().kv_q8(torch.randn(3, 48))
    with pytest.raises(RuntimeError, match="q8_0 rows"):
        kernels().kv_q8_dequant(torch.zeros(3, 100, dtype=torch.int8))


def test_engine_attention_on_a_q8_pool(monkeypatch):
    """paged_attention on a mixed step over q8_0 pools: it writes this step's K/V as q8_0 rows,
    and the kernel's decode rows agree with gather + dequantize + SDPA's."""
    from engine.layers import attention as attn
    from engine.layers.attention import AttentionMetadata, paged_attention
    from test_paged_attention_kernel import B

    H, n_kv, hd = 6, 2, 64
    ctx, new = [40, 1, 130, 24], [1, 1, 1, 10]
    lens = [c + n for c, n in zip(ctx, new)]
    _, k, v, tables, _ = make_case(lens, H, n_kv, hd, torch.float32, seed=3)
    k8, v8 = kernels().kv_q8(k), kernels().kv_q8(v)
    g = torch.Generator().manual_seed(4)
    T = sum(new)
    q, kn, vn = (torch.randn(T, h, hd, generator=g) for h in (H, n_kv, n_kv))
    slots = torch.tensor([int(tables[i, p // B]) * B + p % B for i in range(4) for p in range(ctx[i], lens[i])])
    starts = [0, 1, 2, 3, T]

    def run(pools):
        meta = AttentionMetadata(slot_mapping=slots, query_start_loc=starts, seq_lens=lens, block_tables=tables,
                                 num_decodes=3)
        return paged_attention(q, kn, vn, pools[0], pools[1], meta, hd ** -0.5), pools

    got, pools = run((k8.clone(), v8.clone()))
    assert torch.equal(pools[0].view(-1, n_kv, hd + hd // 16)[slots], kernels().kv_q8(kn))  # written as q8_0
    monkeypatch.setattr(attn, "decode_kernel_available", lambda cache: False)
    want, _ = run((k8.clone(), v8.clone()))
    assert torch.equal(got[3:], want[3:])
    torch.testing.assert_close(got[:3], want[:3], rtol=0, atol=1e-5)


@torch.inference_mode()
def q8_logits(model, tokens: list[int]) -> torch.Tensor:
    """Teacher-forced logits of one sequence over a q8_0 pool (model_oracles.our_logits' twin)."""
    from model_oracles import BLOCK, prefill_meta

    cfg, T = model.config, len(tokens)
    nb, width = -(-T // BLOCK), cfg.head_dim + cfg.head_dim // 16
    pools = [tuple(torch.zeros(nb, BLOCK, cfg.num_kv_heads, width, dtype=torch.int8) for _ in range(2))
             for _ in range(cfg.num_layers)]
    return model.compute_logits(model(torch.tensor(tokens), torch.arange(T), pools, prefill_meta(0, T, nb)))


def test_q8_kv_fidelity_against_llama_cpp(bundled_model_path, computed_once):
    """What the 8-bit cache costs, on the bundled model's teacher-forced corpus against llama.cpp
    (f16 KV): the perplexity and KL bars of the green-everywhere issue (top-1 is not asked of a
    lossy cache). For scale, what llama.cpp's own q8_0 cache costs it on the same corpus, measured
    on an AMD EPYC (AVX-512 VNNI): PPL ratio 0.9978, mean KL 0.00499, top-1 95.50%; Ember's,
    1.0007, 0.00538, 94.52%."""
    from model_oracles import agreement, format_summary, llama_cpp_corpus_logits, summarize

    from engine.loaders.gguf_loader import load_model

    oracle = computed_once("bundled-llama-cpp-corpus", lambda: llama_cpp_corpus_logits(bundled_model_path))
    chunks, theirs = oracle["chunks"], oracle["logits"]  # llama.cpp with its f16 KV
    model = load_model(bundled_model_path, torch.float32, "cpu", quantized=True)
    ours = summarize([agreement(q8_logits(model, c)[:-1], t[:-1], torch.tensor(c[1:])) for c, t in zip(chunks, theirs)])
    print("\n" + format_summary("Ember, q8_0 KV vs llama.cpp f16 KV", ours))
    assert abs(ours["ppl_ratio"] - 1) <= 0.01 and ours["kl"] <= 0.01, ours


@pytest.mark.parametrize("backend", ["torch", "llama.cpp"])
def test_engines_run_on_a_q8_cache(bundled_model_path, backend):
    """`kv_cache_dtype="q8_0"` on both runners: the torch pool holds int8 rows at 17/16 bytes a
    value; a greedy reply comes out the same alone and after its prompt is cached."""
    from engine.backends import load_engine
    from engine.config import EngineConfig
    from engine.sampling_params import SamplingParams

    engine, _ = load_engine(EngineConfig(model_path=str(bundled_model_path), kv_cache_dtype="q8_0",
                                         num_kv_blocks=64), backend)
    if backend == "torch":
        k = engine.runner.kv_caches[0][0]
        hd = engine.runner.model.config.head_dim
        assert k.dtype == torch.int8 and k.shape[-1] == hd + hd // 16
    ids = engine.tokenizer.encode("The capital of France is")
    params = SamplingParams(temperature=0.0, max_tokens=12)
    first = engine.generate([ids], params)[0].output_token_ids
    again = engine.generate([ids], params)[0].output_token_ids
    assert len(first) == 12 and first == again
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(model_path=str(bundled_model_path), kv_cache_dtype="q4")
