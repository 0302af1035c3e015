"""The float64 oracle's mixture-of-experts FFN (tests/model_oracles.py reference_logits), written
from llama.cpp 0.3.36's build_moe_ffn as the qwen3moe and qwen2moe graphs call it, sharing
nothing with Ember's layer: softmax over every expert's router logit, the top k, renormalised to
sum to one where the graph says so (qwen3moe's passes norm_w = true, qwen2moe's false), and each
token's k SwiGLU experts weighed and summed; qwen2moe then adds its shared expert, a SwiGLU MLP
scaled by the sigmoid of its gate row's logit (ffn_gate_inp_shexp). Dense on purpose: every token
against its own experts' full matrices, no grouping."""
from __future__ import annotations

import torch
import torch.nn.functional as F

RENORMALISED = {"qwen3moe"}  # architectures whose graph divides the top-k weights by their sum


def _swiglu(h: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    return (F.silu(h @ gate.T) * (h @ up.T)) @ down.T


def moe_ffn(h: torch.Tensor, t, p: str, arch: str, used: int) -> torch.Tensor:
    """h [T, d] -> [T, d]; `t` reads a tensor by GGUF name ([n_expert, rows, in] for the stacks)."""
    probs = (h @ t(p + "ffn_gate_inp.weight").T).softmax(-1)
    w, chosen = probs.topk(used, dim=-1)
    if arch in RENORMALISED:
        w = w / w.sum(-1, keepdim=True)
    gate, up, down = (t(p + f"ffn_{n}_exps.weight")[chosen] for n in ("gate", "up", "down"))  # [T, k, ...]
    a = F.silu(torch.einsum("td,tkfd->tkf", h, gate)) * torch.einsum("td,tkfd->tkf", h, up)
    y = (w[..., None] * torch.einsum("tkf,tkdf->tkd", a, down)).sum(1)
    shared_gate = t(p + "ffn_gate_inp_shexp.weight")
    if shared_gate is not None:  # qwen2moe's shared expert
        shared = _swiglu(h, *(t(p + f"ffn_{n}_shexp.weight") for n in ("gate", "up", "down")))
        y = y + torch.sigmoid(h @ shared_gate)[:, None] * shared
    return y
