"""Paged attention over a block-structured KV pool, for prefill chunks and decodes in one batch.

The batch is flattened (varlen): sequence i owns query rows
``query_start_loc[i]:query_start_loc[i+1]``. Its context after this step is ``seq_lens[i]``
tokens, whose K/V live in the pool at ``block_tables[i]``; token at position p sits in slot
``block_tables[i][p // B] * B + p % B``. New tokens' K/V are written to ``slot_mapping`` first,
so every query reads its whole context (cached prefix + this step) from the pool.

GQA: the pool stores K/V once per KV head ``[num_blocks, B, n_kv, hd]``; query head h reads KV
head ``h // (n_heads / n_kv)`` through ``scaled_dot_product_attention(enable_gqa=True)``; K/V
are never repeated in memory.

A sliding-window layer (window W > 0) lets the query at position p see keys p - W < j <= p, as
llama.cpp's standard SWA mask does; the pool still holds every position.

Attention sinks (gpt-oss): each query head has one more logit, the head's learned sink, in its
softmax, over a zero value: it takes its share of the weights and adds nothing (llama.cpp's
ggml_soft_max_add_sinks). Here it is one more key with a zero key and value and the sink as its
additive mask; the C++ decode kernel adds e^(sink - max) to its softmax's sum.

Decode rows on a CPU go to Ember's C++ kernel (engine/kernels/attention.py) when it is built:
it reads the blocks in place instead of gathering a padded copy (2-8x faster). Gather + SDPA
stays for prefill chunks, for GPUs and when the kernel is missing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.kernels.attention import decode_kernel_available, paged_decode, q8_rows, q8_values


@dataclass(slots=True)
class AttentionMetadata:
    """Where this step's tokens go and what each sequence attends to. Built by ModelRunner."""

    slot_mapping: torch.Tensor  # int64 [T]: pool slot of each new token
    query_start_loc: list[int]  # [S+1] cumulative query lengths (cu_seqlens_q)
    seq_lens: list[int]  # [S] context length of each sequence after this step
    block_tables: torch.Tensor  # int64 [S, max_blocks], padded with 0 (masked by seq_lens)
    num_decodes: int  # the first num_decodes sequences have exactly one query token
    decode_seq_lens: torch.Tensor | None = None  # int64 [num_decodes], seq_lens of the decodes
    # The fallback's, built by the first layer that needs it and shared by the rest (the same
    # for every layer): (max context length, block table cut to it, padding mask [num_decodes, 1, 1, L]).
    decode_plan: tuple[int, torch.Tensor, torch.Tensor] | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter this step's K/V ([T, n_kv, hd]) into their slots of the pool (an int8 pool holds
    q8_0 rows: engine/kernels/csrc/kv_quant.cpp)."""
    n_kv, width = k.shape[1], k_cache.shape[-1]
    q8 = k_cache.dtype == torch.int8
    k_cache.view(-1, n_kv, width).index_copy_(0, slot_mapping, q8_rows(k) if q8 else k.to(k_cache.dtype))
    v_cache.view(-1, n_kv, width).index_copy_(0, slot_mapping, q8_rows(v) if q8 else v.to(v_cache.dtype))


def _gather(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """[..., nb] block ids -> [..., nb*B, n_kv, hd] contiguous context.

    index_select copies whole blocks row by row; advanced indexing (cache[table]) does the
    same copy about 1.6x slower on CPU. q8_0 rows come back as their float32 values."""
    blocks = torch.index_select(cache, 0, block_table.reshape(-1))  # [prod(...)*nb, B, n_kv, hd]
    if cache.dtype == torch.int8:
        blocks = q8_values(blocks)
    return blocks.view(*block_table.shape[:-1], block_table.shape[-1] * cache.shape[1], *blocks.shape[2:])


def decode_plan(block_tables: torch.Tensor, seq_lens: torch.Tensor,
                block_size: int) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(L = longest context, block tables cut to L's blocks, mask [S, 1, 1, L] of real positions)."""
    max_len = int(seq_lens.max())
    nb = (max_len + block_size - 1) // block_size
    mask = torch.arange(max_len, device=seq_lens.device)[None, :] < seq_lens[:, None]
    return max_len, block_tables[:, :nb], mask[:, None, None, :]


def with_sinks(k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
               sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k, v [..., n_kv, L, hd] and a bool mask [..., 1 or H, n, L] (True: attend) -> k and v with
    one more key, zero, and the additive float mask [..., H, n, L + 1] whose last column is each
    head's sink logit."""
    H, n = sinks.shape[0], mask.shape[-2]
    zero = k.new_zeros(*k.shape[:-2], 1, k.shape[-1])
    bias = torch.zeros(mask.shape, dtype=k.dtype, device=k.device).masked_fill_(~mask, float("-inf"))
    lead = mask.shape[:-3]
    sink = sinks.to(k.dtype).view(H, 1, 1).expand(*lead, H, n, 1)
    bias = torch.cat((bias.expand(*lead, H, n, mask.shape[-1]), sink), -1)
    return torch.cat((k, zero), -2), torch.cat((v, zero), -2), bias


def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            plan: tuple[int, torch.Tensor, torch.Tensor], scale: float, window: int = 0,
            seq_lens: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One query token per sequence, batched; padding beyond seq_len (and, with a window, keys
    before seq_len - window) is masked out."""
    max_len, table, mask = plan
    if window:
        mask = mask & (torch.arange(max_len, device=q.device) >= (seq_lens - window)[:, None])[:, None, None, :]
    k = _gather(k_cache, table)[:, :max_len].transpose(1, 2)  # [S, n_kv, L, hd]
    v = _gather(v_cache, table)[:, :max_len].transpose(1, 2)
    if sinks is not None:
        k, v, mask = with_sinks(k, v, mask, sinks)
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2).to(k.dtype), k, v, attn_mask=mask, scale=scale, enable_gqa=True)  # q [S, H, 1, hd]
    return out.squeeze(2)


def _decode_rows(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                 scale: float, window: int = 0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The first num_decodes rows of q, one token per sequence: the kernel, else gather + SDPA."""
    nd = meta.num_decodes
    if meta.decode_seq_lens is None:
        meta.decode_seq_lens = torch.tensor(meta.seq_lens[:nd], dtype=torch.long, device=q.device)
    if decode_kernel_available(k_cache):
        return paged_decode(q, k_cache, v_cache, meta.block_tables[:nd], meta.decode_seq_lens, scale, window=window,
                            sinks=sinks)
    if meta.decode_plan is None:
        meta.decode_plan = decode_plan(meta.block_tables[:nd], meta.decode_seq_lens, k_cache.shape[1])
    return _decode(q, k_cache, v_cache, meta.decode_plan, scale, window, meta.decode_seq_lens, sinks)


def _prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             block_table: torch.Tensor, seq_len: int, scale: float, window: int = 0,
             sinks: torch.Tensor | None = None) -> torch.Tensor:
    """A chunk of n query tokens at positions [seq_len-n, seq_len) over a seq_len context."""
    n = q.shape[0]
    nb = (seq_len + k_cache.shape[1] - 1) // k_cache.shape[1]
    k = _gather(k_cache, block_table[:nb])[:seq_len].transpose(0, 1)  # [n_kv, L, hd]
    v = _gather(v_cache, block_table[:nb])[:seq_len].transpose(0, 1)
    qh = q.transpose(0, 1).to(k.dtype)  # [H, n, hd]
    windowed = 0 < window < seq_len
    if n == seq_len and not windowed and sinks is None:
        out = F.scaled_dot_product_attention(qh, k, v, is_causal=True, scale=scale, enable_gqa=True)
    else:
        # Query j sits at absolute position a = seq_len - n + j and sees keys 0..a (a - W < key
        # with a window W: the band between two diagonals).
        mask = torch.ones(n, seq_len, dtype=torch.bool, device=q.device).tril(seq_len - n)
        if windowed:
            mask = mask.triu(seq_len - n - window + 1)
        if sinks is not None:
            k, v, mask = with_sinks(k, v, mask[None], sinks)
        out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float, window: int = 0,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, H, hd], k/v [T, n_kv, hd] for this step's tokens -> [T, H, hd]; window 0: full;
    sinks [H]: each head's sink logit (None: none)."""
    write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    nd = meta.num_decodes
    if nd:
        decoded = _decode_rows(q[:nd], k_cache, v_cache, meta, scale, window, sinks).to(q.dtype)
        if nd == meta.num_seqs:  # a pure decode step (the common one): no scatter into `out`
            return decoded
    out = torch.empty_like(q)
    if nd:
        out[:nd] = decoded
    for i in range(nd, meta.num_seqs):
        s, e = meta.query_start_loc[i], meta.query_start_loc[i + 1]
        out[s:e] = _prefill(q[s:e], k_cache, v_cache, meta.block_tables[i], meta.seq_lens[i], scale,
                            window, sinks).to(q.dtype)
    return out


class PagedAttention(torch.nn.Module):
    """The attention a model layer calls; the KV pool and metadata are passed in each step."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float | None = None,
                 window: int = 0, sinks: torch.Tensor | None = None) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5 if scale is None else scale
        self.window = window
        if sinks is not None and sinks.shape != (num_heads,):
            raise ValueError(f"{tuple(sinks.shape)} sinks for {num_heads} heads")
        self.register_buffer("sinks", None if sinks is None else sinks.float(), persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        return paged_attention(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, self.window, self.sinks)
