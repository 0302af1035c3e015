"""AWQ (Lin et al. 2023, "AWQ: Activation-aware Weight Quantization"; AutoAWQ awq/quantize/
auto_scale.py and auto_clip.py).

Scale search. For linears that share an input x (q/k/v, gate/up), y = x W^T = (x / s) (W diag s)^T
for any per-channel s > 0; quantizing W diag s instead of W gives the salient input channels
(large mean |x|) finer steps. With s = mean|x|^alpha, normalised by sqrt(max s * min s), the
alpha in {0, 1/grid, ..., (grid-1)/grid} minimising
    sum_i || x W_i^T - (x / s) Q(W_i diag s)^T ||^2,     Q = RTN fake-quant at (bits, G, sym)
is kept. alpha = 0 is s = 1, plain RTN, so the search is never worse than RTN on its data.
The caller folds 1/s into the op that produces x (a norm's weight, or the previous linear's rows).

Clip search (after scaling): per (row, group) clip the weights to [-r m, r m], m = max |w|, for
r in {1, 1 - 1/grid, ..., 1 - max_shrink}, keeping the r with the smallest error of the group's
share of the output, sum_t (x_t,g . (w_g - Q(clip w_g)))^2. r = 1 is no clip. Then each row keeps
its clipped groups only if the whole row's output error is lower for them (see search_clip).

A linear's own output error weighs every output channel alike, which misleads where the linears
of a group differ in scale and in how their errors reach the layer's output: Qwen2's q and k
rows are ~20x v's, so the sum over q, k, v is q and k's error, while v's goes straight through
o_proj and theirs through a softmax. There the caller passes `loss`, the error of the block's
output (AutoAWQ's module2inspect: the attention block for q/k/v), given the effective weights
Q(W diag s) / s.

Both errors are quadratic forms ||x D^T||^2 = tr(D (x^T x) D^T): with more tokens than features
the search works on the Gram matrix x^T x (computed once, in chunks) instead of the tokens,
which is also how all tokens are used where AutoAWQ subsamples 512 for the clip.
"""
from __future__ import annotations

from typing import Callable

import torch

from engine.weights.rtn import as_groups, group_params, quantize_codes, rtn
from engine.weights.int_weight import IntWeight

CHUNK = 4096  # tokens per matmul

Loss = Callable[[list[torch.Tensor]], float]  # effective weights [Q(W_i diag s) / s] -> the error


def _gram(x: torch.Tensor) -> torch.Tensor:
    """float32 [K, K] x^T x, accumulated in float64 over chunks of tokens."""
    acc = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64, device=x.device)
    for t in range(0, x.shape[0], CHUNK):
        xc = x[t:t + CHUNK].float()
        acc += (xc.T @ xc).double()
    return acc.float()


def _abs_mean(x: torch.Tensor) -> torch.Tensor:
    """float32 [K]: mean |x| over tokens, without a full-size |x| copy."""
    acc = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
    for t in range(0, x.shape[0], CHUNK):
        acc += x[t:t + CHUNK].float().abs().sum(0).double()
    return (acc / x.shape[0]).float()


def _row_errors(d: torch.Tensor, x: torch.Tensor, gram: torch.Tensor | None) -> torch.Tensor:
    """[N]: ||x d_n||^2 per row of d [N, K], from the Gram matrix when given, else chunk by chunk."""
    if gram is not None:
        return ((d @ gram) * d).sum(-1)
    return sum(((x[t:t + CHUNK].float() @ d.T) ** 2).sum(0) for t in range(0, x.shape[0], CHUNK))


def _fake_quant(w: torch.Tensor, bits: int, group_size: int, sym: bool) -> torch.Tensor:
    return rtn(w, bits, group_size, sym).dequantize()


def search_scales(x: torch.Tensor, weights: list[torch.Tensor], bits: int, group_size: int, sym: bool = False,
                  grid: int = 20, duo_scaling: bool = False, loss: Loss | None = None) -> torch.Tensor:
    """s [K] float32 for the linears `weights` ([N_i, K]) whose shared input is x [T, K].
    duo_scaling (AutoAWQ's default, off here as in the paper): s = mean|x|^a / mean_w^(1-a),
    mean_w the mean over rows of |w| / (its group's max |w|). loss: the block's error for the
    effective weights (default: the sum of the linears' own output errors on x)."""
    x = x.reshape(-1, x.shape[-1])
    K = x.shape[1]
    x_mean = _abs_mean(x)
    ws = [w.float() for w in weights]
    if loss is None:
        gram = _gram(x) if x.shape[0] > K else None

        def loss(effective: list[torch.Tensor]) -> float:
            return sum(_row_errors(w - e, x, gram).sum().item() for w, e in zip(ws, effective))
    if duo_scaling:
        wa = as_groups(torch.cat(ws).abs(), group_size)
        w_mean = (wa / (wa.amax(-1, keepdim=True) + 1e-6)).reshape(wa.shape[0], -1)[:, :K].mean(0)
    best_err, best = float("inf"), torch.ones(K, device=x.device)
    for i in range(grid):
        alpha = i / grid
        s = x_mean.pow(alpha) / (w_mean.pow(1 - alpha) + 1e-4) if duo_scaling else x_mean.pow(alpha)
        s = s.clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        err = loss([_fake_quant(w * s, bits, group_size, sym) / s for w in ws])
        if err < best_err:
            best_err, best = err, s
    return best.float()


def search_clip(x: torch.Tensor, w: torch.Tensor, bits: int, group_size: int, sym: bool = False,
                grid: int = 20, max_shrink: float = 0.5) -> torch.Tensor:
    """The clipped weight [N, K] (float32): each (row, group) clipped to the ratio of its max |w|
    that minimises the group's output error on x [T, K] (the input after scaling, x / s)."""
    x = x.reshape(-1, x.shape[-1])
    N, K = w.shape
    w3 = as_groups(w.float(), group_size)  # [N, ng, G]
    ng, G = w3.shape[1], w3.shape[2]
    P = ng * G - K  # the short last group's padding
    full = _gram(x) if x.shape[0] > K else None  # also the row check's, below
    if full is not None:  # the groups' blocks on its diagonal: [ng, G, G]
        gram = torch.nn.functional.pad(full, (0, P, 0, P)).view(ng, G, ng, G).diagonal(dim1=0, dim2=2).permute(2, 0, 1)
    else:
        gram = torch.zeros(ng, G, G, dtype=torch.float64, device=x.device)
        for t in range(0, x.shape[0], CHUNK):
            xc = torch.nn.functional.pad(x[t:t + CHUNK].float(), (0, P)).reshape(-1, ng, G).transpose(0, 1)
            gram += (xc.transpose(1, 2) @ xc).double()
        gram = gram.float()

    def group_error(c: torch.Tensor) -> torch.Tensor:  # [N, ng]: the groups' output errors with clip c
        scale, zero = group_params(c, bits, sym)
        d = w3 - scale[..., None] * (quantize_codes(c, scale[..., None], zero[..., None], bits).float() - zero[..., None])
        return (torch.einsum("ngi,gij->ngj", d, gram) * d).sum(-1)

    m = w3.abs().amax(-1, keepdim=True)
    best_m, best_err = m, group_error(w3)
    for i in range(1, int(max_shrink * grid)):
        mi = m * (1 - i / grid)
        err = group_error(torch.clamp(w3, -mi, mi))
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_m = torch.where(better[..., None], mi, best_m)
    clipped = torch.clamp(w3, -best_m, best_m).reshape(N, -1)[:, :K].contiguous()
    # Each group's ratio ignores the other groups of its row, but a row's output error is
    # (sum_g x_g . d_g)^2: clipping shrinks weights toward 0 in every group alike, and those
    # errors add up along the row instead of cancelling. A row keeps its clip only where the
    # whole row's error on x, d G d^T with G = x^T x, is lower than without it.
    w = w.float()
    keep = _row_errors(w - _fake_quant(clipped, bits, group_size, sym), x, full) < \
        _row_errors(w - _fake_quant(w, bits, group_size, sym), x, full)
    return torch.where(keep[:, None], clipped, w)



def awq_quantize(w_scaled: torch.Tensor, bits: int, group_size: int, sym: bool = False) -> IntWeight:
    """The AWQ weight: RTN of W diag(s) (clipped by search_clip); the layer's input is x / s."""
    return rtn(w_scaled, bits, group_size, sym)
