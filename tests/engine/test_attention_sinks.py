"""Attention sinks (gpt-oss) in the paged attention (engine/layers/attention.py): each head's
softmax takes one more logit, the head's sink, over a zero value, as llama.cpp's
ggml_soft_max_add_sinks does. Against a float64 attention written out here: decodes of several
sequences (on Ember's C++ decode kernel when it is built, and on gather + SDPA), a prompt chunk
after a cached prefix, a whole prompt, with and without a sliding window; a sink far below every
score is no sink at all."""
from __future__ import annotations

import pytest
import torch

import engine.layers.attention as attention_module
from engine.kernels import kernels
from engine.layers.attention import AttentionMetadata, PagedAttention

H, KV, HD, B = 4, 2, 16, 4


def _reference(q, keys, values, positions, ctx_len, scale, window, sinks):
    """q [n, H, hd] at `positions` over keys/values [L, KV, hd]; float64, one query at a time."""
    out = []
    for qi, p in zip(q.double(), positions):
        k = keys[:p + 1].double().repeat_interleave(H // KV, 1)  # [p + 1, H, hd]
        v = values[:p + 1].double().repeat_interleave(H // KV, 1)
        s = torch.einsum("hd,lhd->hl", qi, k) * scale
        if window:
            s[:, :max(0, p + 1 - window)] = float("-inf")
        w = torch.cat((s, sinks.double()[:, None]), 1).softmax(-1)[:, :-1]
        out.append(torch.einsum("hl,lhd->hd", w, v))
    return torch.stack(out)


def _pool(blocks: int):
    shape = (blocks, B, KV, HD)
    return torch.zeros(shape), torch.zeros(shape)


@pytest.mark.parametrize("decode", ["kernel", "sdpa"])
@pytest.mark.parametrize("window", [0, 5])
def test_sinks_in_decodes_and_prompt_chunks_match_a_float64_attention(window, decode, monkeypatch):
    if decode == "kernel" and kernels() is None:
        pytest.skip("Ember's CPU kernels are not built")
    if decode == "sdpa":
        monkeypatch.setattr(attention_module, "decode_kernel_available", lambda cache: False)
    g = torch.Generator().manual_seed(window)
    sinks = torch.randn(H, generator=g) * 2
    attn = PagedAttention(H, KV, HD, window=window, sinks=sinks)
    lens = [3, 11, 7]  # three sequences' contexts
    keys = [torch.randn(n, KV, HD, generator=g) for n in lens]
    values = [torch.randn(n, KV, HD, generator=g) for n in lens]
    tables = torch.arange(3 * 4).view(3, 4)
    k_cache, v_cache = _pool(12)

    def slots(i, pos):
        return tables[i, pos // B] * B + pos % B

    # step 1: sequence 0's whole prompt, sequence 1's first 6 tokens
    q1 = [torch.randn(3, H, HD, generator=g), torch.randn(6, H, HD, generator=g)]
    meta = AttentionMetadata(torch.cat([slots(0, torch.arange(3)), slots(1, torch.arange(6))]), [0, 3, 9],
                             [3, 6], tables[:2], 0)
    out = attn(torch.cat(q1), torch.cat([keys[0], keys[1][:6]]), torch.cat([values[0], values[1][:6]]),
               (k_cache, v_cache), meta)
    for i, (q, rows) in enumerate(zip(q1, (slice(0, 3), slice(3, 9)))):
        ref = _reference(q, keys[i], values[i], range(len(q)), len(q), attn.scale, window, sinks)
        torch.testing.assert_close(out[rows].double(), ref, rtol=1e-5, atol=1e-6)
    # step 2: the rest of sequence 1's prompt after its cached 6 tokens, beside sequence 2's prompt
    q2 = [torch.randn(5, H, HD, generator=g), torch.randn(7, H, HD, generator=g)]
    meta = AttentionMetadata(torch.cat([slots(1, torch.arange(6, 11)), slots(2, torch.arange(7))]), [0, 5, 12],
                             [11, 7], tables[1:], 0)
    out = attn(torch.cat(q2), torch.cat([keys[1][6:], keys[2]]), torch.cat([values[1][6:], values[2]]),
               (k_cache, v_cache), meta)
    torch.testing.assert_close(out[:5].double(), _reference(q2[0], keys[1], values[1], range(6, 11), 11,
                                                            attn.scale, window, sinks), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out[5:].double(), _reference(q2[1], keys[2], values[2], range(7), 7, attn.scale,
                                                            window, sinks), rtol=1e-5, atol=1e-6)
    # step 3: every sequence decodes one token, in one batch
    new_k, new_v, q3 = (torch.randn(3, KV, HD, generator=g), torch.randn(3, KV, HD, generator=g),
                        torch.randn(3, H, HD, generator=g))
    keys = [torch.cat((k, nk[None])) for k, nk in zip(keys, new_k)]
    values = [torch.cat((v, nv[None])) for v, nv in zip(values, new_v)]
    lens = [n + 1 for n in lens]
    meta = AttentionMetadata(torch.stack([slots(i, torch.tensor(n - 1)) for i, n in enumerate(lens)]),
                             [0, 1, 2, 3], lens, tables, 3)
    out = attn(q3, new_k, new_v, (k_cache, v_cache), meta)
    for i, n in enumerate(lens):
        ref = _reference(q3[i:i + 1], keys[i], values[i], [n - 1], n, attn.scale, window, sinks)
        torch.testing.assert_close(out[i:i + 1].double(), ref, rtol=1e-5, atol=1e-6)
    # a sink far below every score takes no weight: the plain attention's output
    plain, deep = PagedAttention(H, KV, HD, window=window), PagedAttention(H, KV, HD, window=window,
                                                                            sinks=torch.full((H,), -1e4))
    torch.testing.assert_close(deep(q3, new_k, new_v, (k_cache, v_cache), meta),
                               plain(q3, new_k, new_v, (k_cache, v_cache), meta), rtol=1e-5, atol=1e-6)
    assert (out - plain(q3, new_k, new_v, (k_cache, v_cache), meta)).abs().max() > 1e-3  # these sinks matter


def test_one_sink_per_head():
    with pytest.raises(ValueError, match="sinks for 4 heads"):
        PagedAttention(H, KV, HD, sinks=torch.zeros(3))
