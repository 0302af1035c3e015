"""Gated MLP activations: the fused gate_up projection gives [gate | up]; out = act(gate) * up.

SwiGLU (Llama, Qwen): act = silu. GeGLU (Gemma): act = GELU's tanh form,
0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), which is ggml_gelu's and HF's gelu_pytorch_tanh.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


ACTIVATIONS = {"silu": silu_and_mul, "gelu_tanh": gelu_tanh_and_mul}
