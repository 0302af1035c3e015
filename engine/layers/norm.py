"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, computed in float32 whatever the weight dtype."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # torch's fused kernel: one pass instead of pow/mean/add/rsqrt/mul/mul, same float32 maths.
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)


class RMSNorm(torch.nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Plain norm, or (pre-norm residual stream) add then norm: returns (normed, new residual).

        The residual stream stays float32 (the caller passes a float32 `residual`), so bf16
        weights round each sub-block's output once instead of the running sum every layer.
        """
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        residual = residual + x.float()
        return rms_norm(residual, self.weight, self.eps), residual
