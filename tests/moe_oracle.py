"""The float64 oracle's mixture-of-experts FFN (tests/model_oracles.py reference_logits), written
from llama.cpp 0.3.36's build_moe_ffn as the qwen3moe graph calls it, sharing nothing with
Ember's layer: softmax over every expert's router logit, the top k, renormalised to sum to one
(qwen3moe's graph passes norm_w = true), and each token's k SwiGLU experts weighed and summed.
Dense on purpose: every token against its own experts' full matrices, no grouping."""
from __future__ import annotations

import torch
import torch.nn.functional as F

RENORMALISED = {"qwen3moe"}  # architectures whose graph divides the top-k weights by their sum


def moe_ffn(h: torch.Tensor, t, p: str, arch: str, used: int) -> torch.Tensor:
    """h [T, d] -> [T, d]; `t` reads a tensor by GGUF name ([n_expert, rows, in] for the stacks)."""
    probs = (h @ t(p + "ffn_gate_inp.weight").T).softmax(-1)
    w, chosen = probs.topk(used, dim=-1)
    if arch in RENORMALISED:
        w = w / w.sum(-1, keepdim=True)
    gate, up, down = (t(p + f"ffn_{n}_exps.weight")[chosen] for n in ("gate", "up", "down"))  # [T, k, ...]
    a = F.silu(torch.einsum("td,tkfd->tkf", h, gate)) * torch.einsum("td,tkfd->tkf", h, up)
    y = torch.einsum("tkf,tkdf->tkd", a, down)
    return (w[..., None] * y).sum(1)
