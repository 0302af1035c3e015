"""Perplexity of a loaded model on a token sequence: exp(mean negative log-likelihood).

The text is cut into windows of `window` tokens, each run from an empty context (llama.cpp's
`llama-perplexity` does the same with n_ctx windows); in each window the first `window // 2`
tokens are context only and the rest are scored, so every scored token sees at least half a
window of history and the figure does not depend on where a window starts its first tokens.
"""
from __future__ import annotations

import math

import torch

from engine.layers.attention import AttentionMetadata

BLOCK = 16


@torch.no_grad()
def perplexity(model, ids: list[int], window: int = 512) -> tuple[float, int]:
    """(perplexity, number of scored tokens) of `ids` under `model` (a LlamaForCausalLM)."""
    c = model.config
    if len(ids) < window:
        window = len(ids)
    if window < 4:
        raise ValueError("need at least 4 tokens to measure perplexity")
    nb = -(-window // BLOCK)
    shape = (nb, BLOCK, c.num_kv_heads, c.head_dim)
    caches = [(torch.zeros(shape, dtype=model.dtype), torch.zeros(shape, dtype=model.dtype))
              for _ in range(c.num_layers)]
    nll, scored = 0.0, 0
    first = window // 2
    for s in range(0, len(ids) - window + 1, window):
        x = torch.tensor(ids[s:s + window], dtype=torch.long)
        meta = AttentionMetadata(slot_mapping=torch.arange(window), query_start_loc=[0, window],
                                 seq_lens=[window], block_tables=torch.arange(nb).view(1, nb), num_decodes=0)
        hidden = model(x, torch.arange(window), caches, meta)
        logits = model.compute_logits(hidden[first - 1:-1]).double()
        target = x[first:]
        nll -= float(torch.log_softmax(logits, dim=-1).gather(1, target[:, None]).sum())
        scored += len(target)
    return math.exp(nll / scored), scored
