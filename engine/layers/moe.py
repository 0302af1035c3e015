"""A mixture of experts' FFN: each token's output is the weighted sum of the gated MLPs of the k
experts its router picks (llama.cpp's build_moe_ffn, with the family's Routing as data):

    p = softmax(x @ router^T)              over all experts, in float32
    w, e = top_k(p)                        (w / sum(w) where the family renormalises)
    y = sum_j  w_j * down_e_j(act(gate_up_e_j(x)))
    y = y + sigmoid(x . g) * down_s(act(gate_up_s(x)))     a shared expert (Qwen2-MoE), if any

A step's rows are grouped by expert across the whole batch (a stable sort of the chosen expert
ids), and each expert runs its rows as one matmul, so its weights are read once per step and a
decode step of one stream reads only the k experts it takes. Every expert is an ordinary linear
from make_linear: a QuantLinear over its slice of the file's stacked tensors (the loader repacks
the slice's own blocks; the kernels need no expert index) or a float one. Each row's products are
placed in its own slot and the k slots are added in rank order, as llama.cpp adds them, so a row
gets the same bits whatever else the batch holds (every linear here is row-invariant).

With Ember's kernels the router is the kernels' `moe_route` (fixed-order float32 dots, softmax,
top-k), the one the native decoder stack (engine/kernels/csrc/moe.cpp) runs in the same step, so
these layers and the stack pick the same experts with the same weights; build_stack
(engine/layers/decoder_stack.py) hands the stack `router_weight` and the experts' tiles.
"""
from __future__ import annotations

from typing import Callable

import torch

from engine.kernels import kernels
from engine.layers.activation import ACTIVATIONS
from engine.layers.make_linear import make_linear


class MoE(torch.nn.Module):
    def __init__(self, config, prefix: str, take: Callable, activation: str = "silu") -> None:
        super().__init__()
        routing = config.family.moe
        if routing.gating != "softmax":
            raise NotImplementedError(f"{config.arch}: routing {routing} is not in Ember's engine yet")
        self.top_k, self.norm_top_k = config.num_experts_used, routing.norm_top_k
        router = take(prefix + "router.weight").float()
        self.ops = kernels() if router.device.type == "cpu" else None
        # float32, row-invariant: the kernels' moe_route, else oneDNN's packed linear on a CPU
        # (F.linear's GEMV and GEMM round differently, and a router score's last bit moves the weights)
        self.register_buffer("router_weight", router.contiguous() if self.ops is not None else None, persistent=False)
        self.router = None if self.ops is not None else make_linear(router)
        self.gate_up = torch.nn.ModuleList(make_linear(take(f"{prefix}experts.{e}.gate_up_proj.weight"))
                                           for e in range(config.num_experts))
        self.down = torch.nn.ModuleList(make_linear(take(f"{prefix}experts.{e}.down_proj.weight"))
                                        for e in range(config.num_experts))
        self.act = ACTIVATIONS[activation]
        self.shared_gate_up = self.shared_down = self.shared_gate = None
        gate = take(prefix + "shared_expert_gate.weight").float() if routing.shared_expert else None
        # the shared expert's gate row: float32 for the stack, a row-invariant linear here (as the router's)
        self.register_buffer("shared_gate_weight", None if gate is None else gate.contiguous(), persistent=False)
        if gate is not None:
            self.shared_gate_up = make_linear(take(prefix + "shared_expert.gate_up_proj.weight"))
            self.shared_down = make_linear(take(prefix + "shared_expert.down_proj.weight"))
            self.shared_gate = make_linear(gate[None, :])

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] float32, experts [T, k]) in rank order."""
        if self.ops is not None:
            return self.ops.moe_route(x.float().contiguous(), self.router_weight, self.top_k, self.norm_top_k)
        probs = self.router(x.float()).float().softmax(-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        if self.norm_top_k:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights, chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, d] -> float32 [T, d]."""
        T, k = x.shape[0], self.top_k
        weights, chosen = self.route(x)
        order = chosen.flatten().argsort(stable=True)  # slots (t * k + j: token t's j-th expert) by expert
        counts = torch.bincount(chosen.flatten(), minlength=len(self.gate_up)).tolist()  # rows per expert
        rows = x.index_select(0, order // k)  # each expert's rows, one after the other
        outs, start = [], 0
        for e, n in enumerate(counts):
            if n:
                outs.append(self.down[e](self.act(self.gate_up[e](rows[start:start + n]))))
                start += n
        y = torch.cat(outs).float() * weights.flatten().index_select(0, order)[:, None]
        per_token = torch.empty_like(y).index_copy_(0, order, y).view(T, k, -1)
        out = per_token[:, 0]
        for j in range(1, k):  # in rank order, as llama.cpp adds them
            out = out + per_token[:, j]
        if self.shared_gate is not None:
            shared = self.shared_down(self.act(self.shared_gate_up(x))).float()
            # the sigmoid over [T, d], each row alike: over [T, 1] torch's vector and scalar loops
            # would split the rows by where they fall, and a row's bits would depend on the batch
            out = out + shared * torch.sigmoid(self.shared_gate(x.float()).float().expand_as(shared))
        return out
