"""The exponential race's noise: Exp(1) per token id, from one key per row and step.

The race (sampler.py) draws token argmax_i p_i / E_i. The noise is a pure function of the step's
key and the token's id, so what a seeded request samples depends on its logits only through the
race itself, not on the order a sort leaves near-equal tokens in.
"""
from __future__ import annotations

import torch

# splitmix64's constants (Steele et al. 2014) as signed int64: torch has no uint64 arithmetic
_GOLDEN, _MIX1, _MIX2 = (c - (1 << 64) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _shr(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def token_noise(ids: torch.Tensor, key: int | torch.Tensor) -> torch.Tensor:
    """Exp(1) noise for each token id, a pure function of (key, id): splitmix64's finalizer on
    key + (id+1)·φ gives 64 well-mixed bits, the top 53 a uniform u in (0, 1), and -log u ~ Exp(1).

    Why by id and not by rank: noise handed out in probability order follows any two tokens
    whose probabilities swap, so logits that differ in the last bits (another CPU path, another
    machine) would swap which of two near-equal tokens wins; keyed by id, the winner changes only
    where p_a/E_a and p_b/E_b themselves tie. Self-calibration rests on this (issue 44)."""
    z = ids.to(torch.int64) * _GOLDEN + (key + _GOLDEN)
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    z = z ^ _shr(z, 31)
    u = (_shr(z, 11).to(torch.float64) + 0.5) * 2.0 ** -53
    return (-torch.log(u)).to(torch.float32)  # key a tensor: one per row, broadcast over ids


def step_key(generator: torch.Generator | None) -> int:
    """One draw per row and step from the row's stream: the key of that step's `token_noise`."""
    gdev = generator.device if generator is not None else torch.device("cpu")
    return int(torch.randint(0, 1 << 62, (1,), generator=generator, device=gdev))
