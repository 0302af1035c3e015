"""Verification of draft tokens against the target's distributions: the maths, as pure functions.

Speculative sampling (Leviathan et al. 2023, Chen et al. 2023): drafts x_1..x_k came from q; the
target's final sampling distributions p_1..p_{k+1} (penalties, temperature, top-k/p, min-p, with
the drafts before each position in the history) come from one forward. For i = 1..k: accept x_i
with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection emit y ~ normalize(max(0,
p_i − q_i)) and stop; if all k are accepted emit a bonus y ~ p_{k+1}. Each emitted token is
distributed exactly as p:
    P(y) = q(y)·min(1, p(y)/q(y)) + (1 − Σ_x min(p, q)(x)) · max(0, p(y) − q(y)) / Σ max(0, p − q)
         = min(p, q)(y) + max(0, p(y) − q(y)) = p(y),     because 1 − Σ min(p, q) = Σ max(0, p − q).
A drafter without q (n-gram lookup, a greedy draft model) proposes deterministically: q = δ(x),
so accept with probability p(x) and on rejection draw from p without x. That is the same as
drawing y ~ p and accepting iff y = x (`num_matching`): P(y = x) = p(x), and given y ≠ x, y is
distributed as p with x removed. So one-hot drafts reuse the ordinary batched sampler, and greedy
requests (p one-hot at the argmax) reproduce greedy decoding token for token.
"""
from __future__ import annotations

import torch

from engine.sampling.sampler import apply_penalties, truncate
from engine.sampling_params import SamplingParams


def num_matching(drafts: list[int], drawn: list[int]) -> int:
    """How many leading drafts equal the target's own draws at their positions (drawn[i] is the
    token the target drew at draft i's position); the emitted tokens are drawn[:a + 1]."""
    a = 0
    while a < len(drafts) and drafts[a] == drawn[a]:
        a += 1
    return a


def final_probs(logits: torch.Tensor, params: SamplingParams, history: list[int], num_prompt: int) -> torch.Tensor:
    """The distribution a row is sampled from [V] (float64): the sampler's pipeline, penalties,
    temperature, then top-k/top-p/min-p (engine/sampling/sampler.py `truncate`), renormalized."""
    x = logits.double().clone()[None]
    x = apply_penalties(x, [params], [history], [num_prompt])[0] / params.temperature
    vals, ids = truncate(x, params.top_k, params.top_p, params.min_p)
    p = torch.zeros_like(x)
    w = torch.softmax(vals, 0)
    if ids is None:
        return w
    p[ids] = w
    return p


def _draw(p: torch.Tensor, gen: torch.Generator | None) -> int:
    return int(torch.multinomial(p, 1, generator=gen))


def rejection_sample(p: torch.Tensor, drafts: list[int], q: torch.Tensor,
                     gen: torch.Generator | None) -> list[int]:
    """p [k+1, V] target distributions, q [k, V] the draft's (rows sum to 1; the draft's vocab
    may be smaller: q's missing columns are 0) -> the emitted tokens: the accepted drafts, then
    one recovered or bonus token."""
    out: list[int] = []
    V = p.shape[1]
    for i, x in enumerate(drafts):
        qi = torch.zeros(V, dtype=p.dtype)
        qi[:q.shape[1]] = q[i, :V].to(p.dtype)
        u = float(torch.rand(1, generator=gen, dtype=torch.float64))
        if u * float(qi[x]) < float(p[i, x]):  # accept with probability min(1, p/q)
            out.append(x)
            continue
        residual = (p[i] - qi).clamp_min_(0)
        total = float(residual.sum())
        out.append(_draw(residual / total if total > 0 else p[i], gen))
        return out
    out.append(_draw(p[len(drafts)], gen))
    return out
