"""What a drafter is to the speculator. No torch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from engine.sequence import Sequence


@dataclass(slots=True)
class Draft:
    token_ids: list[int]
    # The distributions the tokens were drawn from ([k, V] tensor, rows summing to 1), or None:
    # the drafter chose them deterministically (q one-hot; engine/sampling/verify.py).
    probs: object | None = None


class Drafter(Protocol):
    name: str  # "ngram" | "draft" (metrics, logs)
    # Whether the acceptance of a draft that was not used can be checked after the step for free
    # (prompt lookup: its proposal is known without running anything).
    shadow: bool
    # Bytes the drafter holds (a draft model's weights and KV; 0 for prompt lookup): counted with
    # its target in the engine's memory budget (engine/service/residency.py).
    memory_bytes: int

    def available(self, seqs: list[Sequence], max_k: int) -> list[int]:
        """How many drafts each sequence could get now (n-gram: the match's continuation, 0 when
        nothing matches; a draft model: max_k)."""
        ...

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        """Up to ks[i] drafts for seqs[i] (every ks[i] >= 1), following seq.token_ids."""
        ...

    def cost(self, num_seqs: int, depth: int) -> float:
        """Seconds it expects to spend drafting `depth` tokens for num_seqs sequences."""
        ...

    def release(self, seq: Sequence) -> None:
        """seq ended or was preempted: drop its state (a draft model's KV)."""
        ...

    def close(self) -> None: ...
