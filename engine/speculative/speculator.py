"""The engine's side of speculative decoding: after each step, measure, then draft for the next.

`after_step` (LLMEngine.step calls it) records the step's cost against its batched tokens and
each verified sequence's acceptance, then picks k per decoding sequence (goodput.choose_ks) and
puts the drafts on seq.spec_token_ids for the scheduler. A sequence drafts only when its request
allows it (`speculative`), has no grammar (its matcher would have to follow unverified tokens) and
has room for more than one token. With a drafter whose proposals are free to compute (prompt
lookup) acceptance is also measured in shadow: the proposal for a sequence given k = 0 is compared
with the token the target then chose. Over the cost model, a guard (guard.py) keeps score of the
realised rate of steps with and without drafts and holds drafting back where it does not pay.
No torch: the drafter may hold a model.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.runner import Runner
from engine.scheduler_output import SchedulerOutput
from engine.sequence import Sequence
from engine.speculative.drafter import Drafter
from engine.speculative.goodput import Acceptance, StepCostModel, choose_ks
from engine.speculative.guard import DraftGuard

DEFAULT_MAX_K = 8
PROBE_EVERY = 32  # steps between forced k = 1 probes of a sequence whose acceptance is not measured in shadow


@dataclass(slots=True)
class SpecStats:
    """Engine-wide, since start."""

    drafter: str
    num_proposed: int = 0  # draft tokens verified
    num_accepted: int = 0
    num_passes: int = 0  # (sequence, step) pairs that verified drafts
    num_emitted: int = 0  # tokens those emitted
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0  # steps that verified drafts
    num_held_back: int = 0  # steps the guard kept plain because drafting did not pay

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted / self.num_proposed if self.num_proposed else None

    @property
    def mean_accepted(self) -> float | None:
        """Drafts accepted per verifying pass."""
        return self.num_accepted / self.num_passes if self.num_passes else None

    @property
    def tokens_per_pass(self) -> float | None:
        return self.num_emitted / self.num_passes if self.num_passes else None


class Speculator:
    def __init__(self, drafter: Drafter, max_k: int = 8, fixed_k: int | None = None,
                 max_model_len: int | None = None) -> None:
        if not 1 <= max_k <= 16 or (fixed_k is not None and not 0 <= fixed_k <= max_k):
            raise ValueError("need 1 <= max_k <= 16 and 0 <= fixed_k <= max_k")
        self.drafter, self.max_k, self.fixed_k = drafter, max_k, fixed_k
        self.max_model_len = max_model_len
        self.costs = StepCostModel()  # the target's steps
        self.acceptance = Acceptance()
        self.stats = SpecStats(drafter.name)
        self._shadow: dict[int, int] = {}  # seq_id -> the first token it would have drafted
        self._since_probe: dict[int, int] = {}
        # what drafting really delivers (None with a fixed k: an experiment decides)
        self.guard = DraftGuard() if fixed_k is None else None
        self._step: tuple[int, bool, float] | None = None  # a decode-only step: (batch, drafted, seconds)
        self._draft_seconds = 0.0  # drafting for the step now being verified

    def eligible(self, seq: Sequence) -> bool:
        p = seq.params
        room = seq.max_tokens - seq.num_output_tokens - 1
        if self.max_model_len is not None:
            room = min(room, self.max_model_len - seq.num_tokens - 1)
        return (p.speculative and p.grammar is None and not seq.is_finished and room > 0
                and seq.num_tokens - seq.num_computed_tokens == 1)

    def observe_step(self, out: SchedulerOutput, seconds: float) -> None:
        """The step's cost against its tokens and attended keys; before postprocess moves the counters."""
        keys = sum(n * s.num_computed_tokens + n * (n + 1) // 2 for s, n in zip(out.seqs, out.num_new_tokens))
        self.costs.observe(out.num_batched_tokens, keys, seconds)
        if any(out.num_spec_tokens):
            self.stats.verify_seconds += seconds
        decode_only = all(n == 1 + d for n, d in zip(out.num_new_tokens, out.num_spec_tokens))
        self._step = (len(out.seqs), any(out.num_spec_tokens), seconds + self._draft_seconds) if decode_only else None
        self._draft_seconds = 0.0

    def after_step(self, out: SchedulerOutput, tokens: list[list[int]], running: list[Sequence]) -> None:
        """Acceptance of what the step verified (or would have, in shadow), then the next drafts."""
        sampled = [(s, d) for s, d, is_sampled in zip(out.seqs, out.num_spec_tokens, out.is_sampled) if is_sampled]
        for (seq, d), new in zip(sampled, tokens):
            shadow = self._shadow.pop(seq.seq_id, None)
            if d:
                a = len(new) - 1
                self.acceptance.observe(seq.seq_id, min(a + 1, d), a)
                st = self.stats
                st.num_proposed += d
                st.num_accepted += a
                st.num_passes += 1
                st.num_emitted += len(new)
            elif shadow is not None and new:
                self.acceptance.observe(seq.seq_id, 1, int(new[0] == shadow))
        if self.guard is not None and self._step is not None:
            batch, drafted, seconds = self._step
            self.guard.observe(batch, drafted, sum(len(new) for new in tokens), seconds)
        self.draft(running)

    def draft(self, running: list[Sequence]) -> None:
        seqs = [s for s in running if self.eligible(s)]
        if not seqs:
            return
        avail = self.drafter.available(seqs, self.max_k)
        if self.fixed_k is not None:
            ks = [min(self.fixed_k, m) for m in avail]
        else:
            # the next step's other work: every running sequence's known tokens (a prefill a chunk)
            base_n = base_keys = 0
            for s in running:
                u, c = min(s.num_tokens - s.num_computed_tokens, 256), s.num_computed_tokens
                base_n, base_keys = base_n + u, base_keys + u * c + u * (u + 1) // 2
            ks = choose_ks([self.acceptance.of(s.seq_id) for s in seqs], avail, [s.num_tokens for s in seqs],
                           lambda n, keys: self.costs(base_n + n, base_keys + keys), self.drafter.cost)
            if not self.drafter.shadow:
                ks = [self._probe(s, k) if m > 0 else 0 for s, k, m in zip(seqs, ks, avail)]
            if any(ks) and not self.guard.allow(len(seqs)):  # measured: drafting does not pay here now
                ks = [0] * len(ks)
                self.stats.num_held_back = self.guard.num_blocked
        chosen = [(s, k) for s, k in zip(seqs, ks) if k > 0]
        if self.drafter.shadow:  # the unused proposals: compared with the target's next token
            for s, k, m in zip(seqs, ks, avail):
                if k == 0 and m > 0:
                    self._shadow[s.seq_id] = self.drafter.propose([s], [1])[0].token_ids[0]
        if not chosen:
            return
        t0 = time.perf_counter()
        drafts = self.drafter.propose([s for s, _ in chosen], [k for _, k in chosen])
        self._draft_seconds = time.perf_counter() - t0
        self.stats.draft_seconds += self._draft_seconds
        for (seq, k), draft in zip(chosen, drafts):
            seq.spec_token_ids = draft.token_ids[:k]
            seq.spec_probs = draft.probs

    def _probe(self, seq: Sequence, k: int) -> int:
        """A drafter without shadow estimates learns only when it drafts: a sequence left at k = 0
        drafts one token every PROBE_EVERY steps, so a rate that has changed is seen."""
        if k > 0:
            self._since_probe[seq.seq_id] = 0
            return k
        n = self._since_probe.get(seq.seq_id, 0) + 1
        self._since_probe[seq.seq_id] = 0 if n >= PROBE_EVERY else n
        return 1 if n >= PROBE_EVERY else 0

    def release(self, seq: Sequence) -> None:
        self.drafter.release(seq)
        if seq.is_finished:
            self.acceptance.release(seq.seq_id)
            self._shadow.pop(seq.seq_id, None)
            self._since_probe.pop(seq.seq_id, None)

    def close(self) -> None:
        self.drafter.close()


def make_speculator(config: EngineConfig, runner: Runner) -> Speculator | None:
    """The Speculator config.speculative asks for (None for "off"); a draft model runs beside the
    target with a KV pool of the target's capacity (reserved, committed as written)."""
    if config.speculative == "off":
        return None
    max_k = DEFAULT_MAX_K if config.num_speculative_tokens is None else max(config.num_speculative_tokens, 1)
    if config.speculative == "ngram":
        from engine.speculative.ngram import NgramDrafter
        drafter: Drafter = NgramDrafter()
    else:
        from engine.speculative.draft_model import DraftModelDrafter
        drafter = DraftModelDrafter(config.speculative.removeprefix("draft:"), config,
                                    runner.vocab_size, runner.kv_capacity_blocks())
    return Speculator(drafter, max_k=max_k, fixed_k=config.num_speculative_tokens,
                      max_model_len=runner.max_model_len)
