"""Next-token sampling for a batch of rows, each with its own SamplingParams and generator.

Pipeline per row (HF/vLLM order):
    logits → penalties → [logprobs taken here] → greedy argmax, or
             / temperature → top-k → top-p → min-p → exponential race
llama.cpp's default chain applies temperature after top-k/top-p/min-p instead; both are
common, and this one makes top-p act on the distribution that is actually sampled.

Cost on a CPU decides the shape: a full sort of a 49k-151k vocab costs tens of ms and noise for
every token about a millisecond, so the batch works on one `topk` window per row (see
`sample_rows`) and draws noise only inside it, keyed by token id (race_noise.py). `truncate` +
`race` is the same thing for one row, written plainly; it is the fallback and the reference.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.runner import TokenLogprobs
from engine.sampling.race_noise import step_key, token_noise
from engine.sampling_params import SamplingParams

REPETITION_WINDOW = 64  # llama.cpp's penalty_last_n default
_TOP_P_WINDOW = 256  # window for top-p without top-k (truncate() widens it 4x until it holds)
_RACE_HEAD = 256  # window of rows without top-k/top-p; the race has two stages (sample_rows)


@dataclass(slots=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


# ---- penalties ---------------------------------------------------------------------------------
def apply_penalties(logits: torch.Tensor, params: list[SamplingParams], histories: list[list[int]],
                    num_prompt: list[int]) -> torch.Tensor:
    """In place on `logits` [N, V]; one gather/scatter for the whole batch.

    Repetition (CTRL/llama.cpp): for each distinct token among the last 64 of prompt+output,
        l > 0: l / r     l <= 0: l · r      (r > 1 makes a seen token less likely either way)
    Frequency/presence (OpenAI), over the output tokens only, with c = the token's count:
        l -= c · frequency_penalty + (c > 0) · presence_penalty
    """
    V = logits.shape[1]
    flat = logits.view(-1)
    rep_idx, rep_r, fp_idx = [], [], []
    for row, (p, hist, n_prompt) in enumerate(zip(params, histories, num_prompt)):
        if p.repetition_penalty != 1.0 and hist:
            seen = {t for t in hist[-REPETITION_WINDOW:] if 0 <= t < V}  # never another row
            rep_idx.extend(row * V + t for t in seen)
            rep_r.extend([p.repetition_penalty] * len(seen))
        if (p.frequency_penalty or p.presence_penalty) and len(hist) > n_prompt:
            fp_idx.extend(row * V + t for t in hist[n_prompt:] if 0 <= t < V)
    if rep_idx:
        idx = torch.tensor(rep_idx, device=logits.device)
        r = torch.tensor(rep_r, device=logits.device, dtype=logits.dtype)
        l = flat[idx]
        flat[idx] = torch.where(l > 0, l / r, l * r)
    if fp_idx:
        idx, counts = torch.unique(torch.tensor(fp_idx, device=logits.device), return_counts=True)
        rows = (idx // V).tolist()
        freq = torch.tensor([params[r].frequency_penalty for r in rows], device=logits.device)
        pres = torch.tensor([params[r].presence_penalty for r in rows], device=logits.device)
        flat[idx] -= (counts.to(logits.dtype) * freq + pres).to(logits.dtype)
    return logits


# ---- truncation: which tokens may be sampled ----------------------------------------------------
def truncate(logits: torch.Tensor, top_k: int, top_p: float, min_p: float
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Kept candidates of one row of tempered logits [V]: (their logits, their ids or None = all).

    top-k keeps the k largest. top-p keeps the shortest head whose probability (renormalized
    over what top-k kept) reaches p: token j (sorted) stays iff cumsum_j − p_j < top_p, so the
    token that crosses p stays and at least one always does. min-p keeps p_i ≥ min_p · p_max,
    i.e. l_i ≥ l_max + log(min_p); renormalizing does not move that line, so it commutes with
    the others.
    Without top-k, top-p needs the sorted head only up to the crossing: take topk(M) and check
    that its mass (relative to the whole vocab's logsumexp) reaches top_p; if not, widen 4x.
    """
    V = logits.shape[0]
    vals, ids = logits, None
    if 0 < top_k < V:
        vals, ids = torch.topk(logits, top_k)  # sorted, descending
    if top_p < 1.0:
        if ids is not None:
            lse = torch.logsumexp(vals, 0)
            head, head_ids = vals, ids
        else:
            lse = torch.logsumexp(logits, 0)
            m = min(_TOP_P_WINDOW, V)
            while True:
                head, head_ids = torch.topk(logits, m)
                if m == V or torch.exp(head - lse).sum().item() >= top_p:
                    break
                m = min(4 * m, V)  # the cut lies further out: widen
        probs = torch.exp(head - lse)
        keep = (torch.cumsum(probs, 0) - probs) < top_p
        keep[0] = True
        vals, ids = head[keep], head_ids[keep]
    if min_p > 0.0:
        keep = vals >= vals.max() + math.log(min_p)
        if ids is None:
            ids = keep.nonzero().squeeze(1)
            vals = vals[ids]
        else:
            vals, ids = vals[keep], ids[keep]
    return vals, ids


# ---- drawing ----------------------------------------------------------------------------------
def race(vals: torch.Tensor, generator: torch.Generator | None, ids: torch.Tensor | None = None) -> int:
    """Index of a sample from softmax(vals) [n] by the exponential race argmax_i p_i / E_i, E_i
    the noise of token ids[i] (ids None: vals is indexed by token id).

    Why it works: E_i/p_i ~ Exp(rate p_i), independent; the smallest of independent exponentials
    is i with probability p_i / Σp, so p need not be normalized.
    """
    p = torch.exp(vals - vals.max())
    ids = torch.arange(p.shape[0], device=p.device) if ids is None else ids
    return int(torch.argmax(p / token_noise(ids, step_key(generator))))


def _top_p_keep(x: torch.Tensor, vals: torch.Tensor, valid: torch.Tensor, params: list[SamplingParams],
                has_k: list[bool], use_p: list[bool], W: list[int]) -> tuple[torch.Tensor, list[bool]]:
    """`truncate`'s top-p on each row's window: the kept mask, and per row whether the window
    holds the cut (a row whose cut lies beyond it falls back to `truncate`)."""
    n, dev = x.shape[0], x.device
    keep = valid.clone()
    if not any(use_p):
        return keep, [True] * n
    has_k_t, use_p_t = torch.tensor(has_k, device=dev), torch.tensor(use_p, device=dev)
    top_p = torch.tensor([p.top_p for p in params], device=dev)
    # top-p on the distribution after top-k: normalize over the top-k set ...
    lse = torch.logsumexp(vals.masked_fill(~valid, -float("inf")), -1)
    if not all(has_k[r] for r in range(n) if use_p[r]):  # ... else over the whole vocab
        lse = torch.where(has_k_t, lse, torch.logsumexp(x, -1))
    probs = torch.exp(vals - lse[:, None]).masked_fill(~valid, 0.0)
    cum = torch.cumsum(probs, -1)
    keep &= ~use_p_t[:, None] | ((cum - probs) < top_p[:, None])
    keep[:, 0] = True
    reach = cum.gather(1, (torch.tensor(W, device=dev) - 1)[:, None]).squeeze(1) >= top_p
    return keep, (has_k_t | ~use_p_t | reach).tolist()


def _min_p_line(vals: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor | None:
    """Per row, the lowest logit min-p keeps: l_max + log(min_p) ([n, 1]; min_p = 0 keeps all)."""
    if not any(p.min_p > 0 for p in params):
        return None
    return vals[:, :1] + torch.tensor([[math.log(p.min_p) if p.min_p > 0 else -float("inf")]
                                       for p in params], device=vals.device)


def sample_rows(x: torch.Tensor, params: list[SamplingParams],
                gens: list[torch.Generator | None]) -> list[int]:
    """One draw per row of tempered, penalized logits x [n, V]; `truncate` + `race`, batched.

    Each row gets a sorted window of W candidates from one batched topk: W = top_k, or 256 for
    top-p alone (proved wide enough in `_top_p_keep`, else that row falls back to `truncate`), or
    256 for rows with no top-k/top-p. The masks are `truncate`'s definitions on the window. A row
    draws noise only for its own W candidates, so its tokens do not depend on its batch neighbours.
    Rows without top-k/top-p keep tokens outside the window, so their race has two stages
    (exact): with P_H the kept mass inside the window, one uniform picks the window with
    probability P_H, then the race runs inside it; a token there is drawn with probability
    P_H · p_i/P_H = p_i. Otherwise (rare) the race runs over the kept tokens outside it.
    """
    n, V = x.shape
    dev, inf = x.device, float("inf")
    has_k = [0 < p.top_k < V for p in params]
    use_p = [p.top_p < 1.0 for p in params]
    W = [min(p.top_k if k else (_TOP_P_WINDOW if tp else _RACE_HEAD), V)
         for p, k, tp in zip(params, has_k, use_p)]
    vals, ids = torch.topk(x, max(W), dim=-1)  # [n, K], descending
    valid = torch.arange(vals.shape[1], device=dev) < torch.tensor(W, device=dev)[:, None]
    keep, covered = _top_p_keep(x, vals, valid, params, has_k, use_p, W)
    line = _min_p_line(vals, params)
    if line is not None:
        keep &= vals >= line
    two_stage = [not k and not tp and w < V for k, tp, w in zip(has_k, use_p, W)]
    if any(two_stage):  # P_H per row: the window's share of the kept mass
        kept_x = x if line is None else x.masked_fill(x < line, -inf)
        p_head = torch.exp(torch.logsumexp(vals.masked_fill(~keep, -inf), -1)
                           - torch.logsumexp(kept_x, -1)).tolist()
    keys = [0] * n  # per row, the key of its noise (race_noise.py)
    tokens: list[int | None] = [None] * n
    for r, (p, g) in enumerate(zip(params, gens)):
        if not covered[r]:  # top-p needs more than the window: the plain per-row path
            t_vals, t_ids = truncate(x[r], p.top_k, p.top_p, p.min_p)
            j = race(t_vals, g, t_ids)
            tokens[r] = j if t_ids is None else int(t_ids[j])
            continue
        if two_stage[r]:
            gdev = g.device if g is not None else dev
            if torch.rand(1, generator=g, device=gdev).item() >= p_head[r]:
                tail = kept_x[r].clone()
                tail[ids[r, :W[r]]] = -inf
                tokens[r] = race(tail, g)
                continue
        keys[r] = step_key(g)
    noise = token_noise(ids, torch.tensor(keys, device=dev)[:, None])
    score = torch.exp(vals - vals[:, :1]).masked_fill(~keep, -1.0) / noise
    choice = ids.gather(1, score.argmax(-1, keepdim=True)).squeeze(1).tolist()
    return [c if t is None else t for c, t in zip(choice, tokens)]


def _take_rows(x: torch.Tensor, rows: list[int]) -> torch.Tensor:
    return x if len(rows) == x.shape[0] else x.index_select(0, torch.tensor(rows, device=x.device))


def argmax_rows(x: torch.Tensor) -> list[int]:
    """The first largest index of each row. On the CPU through numpy, whose vectorized argmax is
    ~20x torch's here (a 151,936-token row: 0.014 vs 0.38 ms): a speculative step takes the
    argmax of every draft's row."""
    if x.device.type == "cpu":
        return x.numpy().argmax(-1).tolist()
    return x.argmax(dim=-1).tolist()


def token_logprobs(logp: torch.Tensor, token_id: int, num_top: int) -> TokenLogprobs:
    """From a row of log-softmax [V]: the token's logprob and the top `num_top` (id, logprob)."""
    top: list[tuple[int, float]] = []
    if num_top > 0:
        v, i = torch.topk(logp, min(num_top, logp.shape[0]))
        top = list(zip(i.tolist(), v.tolist()))
    return TokenLogprobs(token_id, float(logp[token_id]), top)


class Sampler:
    """Picks one token per row. Stateless apart from the generator for unseeded rows."""

    def __init__(self, seed: int | None = None) -> None:
        self._seed = seed
        self._generators: dict[str, torch.Generator] = {}  # per device, for rows without a seed

    def _default_generator(self, device: torch.device) -> torch.Generator | None:
        if self._seed is None:
            return None  # torch's global RNG
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device).manual_seed(self._seed)
        return self._generators[key]

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator | None], histories: list[list[int]],
                 num_prompt: list[int]) -> SamplerOutput:
        n = logits.shape[0]
        if not n:
            return SamplerOutput([], [])
        if not (len(params) == len(generators) == len(histories) == len(num_prompt) == n):
            raise ValueError("one SamplingParams, generator, history and prompt length per row")
        logits = logits.float()
        if any(p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty
               for p in params):  # penalties write into a copy, never the caller's logits
            logits = apply_penalties(logits.clone(), params, histories, num_prompt)
        tokens: list[int] = [0] * n
        greedy = [r for r, p in enumerate(params) if p.is_greedy]
        if greedy:
            picked = _take_rows(logits, greedy)
            for r, t in zip(greedy, argmax_rows(picked)):
                tokens[r] = t
        rows = [r for r, p in enumerate(params) if not p.is_greedy]
        if rows:
            gens = [generators[r] for r in rows]
            if any(g is None for g in gens):
                default = self._default_generator(logits.device)
                gens = [default if g is None else g for g in gens]
            temps = torch.tensor([[params[r].temperature] for r in rows], device=logits.device)
            x = _take_rows(logits, rows)
            drawn = sample_rows(x / temps, [params[r] for r in rows], gens)
            for r, t in zip(rows, drawn):
                tokens[r] = t
        lp_rows = [r for r, p in enumerate(params) if p.logprobs is not None]
        out_lp: list[TokenLogprobs | None] = [None] * n
        if lp_rows:
            logp = torch.log_softmax(logits[lp_rows], dim=-1)
            for k, r in enumerate(lp_rows):
                out_lp[r] = token_logprobs(logp[k], tokens[r], params[r].logprobs)
        return SamplerOutput(tokens, out_lp)
