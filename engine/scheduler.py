"""Which tokens of which sequences the next forward computes. No torch.

One unified step, like vLLM V1: every sequence has known tokens without K/V (a prompt chunk,
or the one token sampled last step) and gets up to min(that, max_prefill_chunk, budget) of
them. Running sequences go first, decodes (one token) before prefill chunks, so a long prompt
delays the running chats by at most one chunk; then waiting sequences are admitted in
(priority, arrival) order while the token budget, max_num_seqs and free blocks allow.

When blocks run out, the lowest-priority, then newest, running sequence is preempted by
recompute: its blocks are freed (their hashes stay, so the recompute mostly hits the prefix
cache), num_computed_tokens goes back to 0, and it waits again ahead of everything that came
after it. A waiting sequence may also preempt running ones of strictly lower priority, so an
interactive chat never queues behind background jobs. Background work (a warm: a chat's prompt
computed into the prefix cache ahead of its turn) gets tokens only in a step with no other request.

A scored prompt (echo) is computed the same way every time: never from a cache, each chunk in a
step of its own (oneDNN's bf16 and llama.cpp's GEMMs round a row differently in another batch),
no more at once than the runner keeps apart (llama.cpp: one, backends/llamacpp_batch.py).
"""
from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.scheduler_output import PromptCache, SchedulerOutput
from engine.sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager,
                 prompt_cache: PromptCache | None = None, max_scoring_seqs: int | None = None) -> None:
        self.config = config
        self.block_manager = block_manager
        self.prompt_cache = prompt_cache
        self.max_scoring_seqs = max_scoring_seqs  # prompt-logprob sequences at once (None: any)
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_prefill_chunk = config.max_prefill_chunk
        self.max_model_len = config.max_model_len
        self.waiting: list[Sequence] = []  # in (priority, arrival) order: _by_key
        self.running: list[Sequence] = []
        self.requests: dict[str, Sequence] = {}  # unfinished, by request id
        self.num_preemptions = 0  # since start, for stats and tests

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def has_foreground(self) -> bool:
        """Whether a request that is not background work is running or waiting."""
        return any(not s.params.background for s in self.running + self.waiting)

    # ---- requests ------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a sequence. A prompt that cannot fit the pool (or max_model_len) is rejected
        here, and seq.max_tokens is lowered so that the sequence alone always fits: a sequence
        never waits for blocks that cannot exist."""
        bm = self.block_manager
        pool_tokens = bm.num_blocks * bm.block_size
        if seq.num_prompt_tokens > pool_tokens:
            raise ValueError(
                f"the prompt has {seq.num_prompt_tokens} tokens but the KV pool holds only "
                f"{pool_tokens} ({bm.num_blocks} blocks of {bm.block_size} tokens)")
        # The last sampled token needs no K/V: prompt + max_tokens - 1 slots at most.
        room = pool_tokens - seq.num_prompt_tokens + 1
        if self.max_model_len is not None:
            if seq.num_prompt_tokens >= self.max_model_len + seq.params.embed:  # an embedding needs no reply
                raise ValueError(f"the prompt has {seq.num_prompt_tokens} tokens; the context "
                                 f"is {self.max_model_len} and leaves no room for a reply")
            room = min(room, self.max_model_len - seq.num_prompt_tokens)
        if seq.request_id in self.requests:
            raise ValueError(f"request id {seq.request_id!r} is already queued")
        seq.max_tokens = min(seq.max_tokens, room)
        seq.status = SequenceStatus.WAITING
        self.requests[seq.request_id] = seq
        bisect.insort(self.waiting, seq, key=_by_key)

    def finish(self, seq: Sequence, status: SequenceStatus = SequenceStatus.FINISHED_STOPPED) -> None:
        """End a sequence and free its blocks at once."""
        assert status.is_finished
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status == SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = status
        self.requests.pop(seq.request_id, None)

    def abort(self, request_id: str) -> Sequence | None:
        """Cancel a request wherever it is; its blocks are free when this returns."""
        seq = self.requests.get(request_id)
        if seq is not None:
            self.finish(seq, SequenceStatus.FINISHED_ABORTED)
        return seq

    # ---- one step ------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        return self._scoring_step() or self._step()

    def _scoring_step(self) -> SchedulerOutput | None:
        """A step of one scored prompt's next chunk, alone; None when there is none to run."""
        bm, chunk = self.block_manager, self.max_prefill_chunk
        seq = min((s for s in self.running if s.is_scoring_prompt), key=_by_key, default=None)
        if seq is not None:
            n = min(seq.num_prompt_tokens - seq.num_computed_tokens, chunk)
            if not bm.can_append(seq, n):
                return None  # it waits for blocks while the others run
            return SchedulerOutput([seq], [n], int(n == 1), block_copies=bm.append_slots(seq, n))
        seq = self.waiting[0] if self.waiting else None
        if seq is None or not seq.is_scoring_prompt or len(self.running) >= self.max_num_seqs:
            return None  # the common case: nothing to score, and no more work than a glance
        n, limit = min(seq.num_tokens, chunk), self.max_scoring_seqs
        full = limit is not None and sum(s.scores_prompt for s in self.running) >= limit
        if full or not bm.can_allocate(seq, n, []):
            return None
        self.waiting.pop(0)
        bm.allocate(seq, n, [])
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        return SchedulerOutput([seq], [n], int(n == 1))

    def _step(self) -> SchedulerOutput:
        plan = _Plan(self.max_num_batched_tokens, self.has_foreground())
        self._schedule_running(plan)
        self._admit_waiting(plan)
        return self._output(plan)

    def _preempt(self, plan: _Plan, victim: Sequence) -> None:
        """Recompute `victim` later: its blocks go back now, and so do its slots of this step."""
        plan.budget += plan.scheduled.pop(victim, 0)
        plan.drafts.pop(victim, None)
        victim.clear_spec()
        self.running.remove(victim)
        self.block_manager.free(victim)  # num_computed_tokens -> 0; token_ids stay and are recomputed
        victim.status = SequenceStatus.WAITING
        victim.num_preemptions += 1
        self.num_preemptions += 1
        bisect.insort(self.waiting, victim, key=_by_key)
        plan.preempted.append(victim)

    def _schedule_running(self, plan: _Plan) -> None:
        """1. Running sequences: decodes, then prefill chunks, each in (priority, arrival) order."""
        bm, running, chunk = self.block_manager, SequenceStatus.RUNNING, self.max_prefill_chunk
        pool_tokens = bm.num_blocks * bm.block_size
        # Drafts never take a slot of the budget from another decode of this step.
        decodes_left = sum(len(s.token_ids) - s.num_computed_tokens == 1 for s in self.running)
        for seq in sorted(self.running, key=_decodes_first):
            decodes_left -= len(seq.token_ids) - seq.num_computed_tokens == 1
            if seq.status is not running or (seq.params.background and plan.foreground):
                continue  # preempted earlier in this loop; background work yields to requests
            n = min(len(seq.token_ids) - seq.num_computed_tokens, chunk, plan.budget)
            if seq.is_scoring_prompt:
                continue  # in a step of its own
            if n <= 0:
                continue
            if seq.num_computed_tokens + n > pool_tokens:
                self.finish(seq, SequenceStatus.FINISHED_LENGTH)  # cannot fit even alone
                plan.finished.append(seq)
                continue
            d = self._num_drafts(seq, n, plan.budget - decodes_left)
            if d and not bm.can_append(seq, n + d):
                d = 0  # drafts never preempt anyone
            while not bm.can_append(seq, n + d):
                self._preempt(plan, max(self.running, key=_by_key))  # the least urgent; may be seq itself
                if seq.status is not running:
                    break
            else:
                plan.block_copies += bm.append_slots(seq, n + d)
                plan.scheduled[seq] = n + d
                plan.budget -= n + d
                if d:
                    plan.drafts[seq] = d
            if seq.spec_token_ids and not d:
                seq.clear_spec()

    def _admit_waiting(self, plan: _Plan) -> None:
        """2. Waiting sequences in order; a head that does not fit blocks the rest (no
        overtaking) unless running work of strictly lower priority can make room."""
        bm = self.block_manager
        while self.waiting and plan.budget > 0:
            seq = self.waiting[0]
            if seq in plan.preempted or (seq.params.background and plan.foreground):
                break  # preempted in this very step: it resumes in a later one; background work waits
            # an embedding pools every prompt row: none may come from a cache
            cached = bm.match_prefix(seq, from_disk=True) if not seq.params.embed else []
            reused = (self.prompt_cache.match_prompt(seq) if self.prompt_cache and not cached
                      and not seq.params.embed else 0)
            n = min(seq.num_tokens - len(cached) * bm.block_size - reused, self.max_prefill_chunk, plan.budget)
            if seq.is_scoring_prompt:
                break  # in a step of its own (no overtaking)
            has_room = bm.can_allocate(seq, reused + n, cached)
            if len(self.running) >= self.max_num_seqs or not has_room:
                lower = [s for s in self.running if s.priority > seq.priority]
                if not lower or not (has_room or self._room_without(lower, seq, reused + n, cached)):
                    break
                self._preempt(plan, max(lower, key=_by_key))  # it waits behind seq: lower priority
                continue
            self.waiting.pop(0)
            if reused:
                # The runner's cells already hold the first `reused` tokens: blocks still cover
                # them (they occupy cells), but only the tail is computed. A smaller claim than
                # the match only shortens the prefix, so the room checked above still suffices.
                reused = self.prompt_cache.claim_prompt(seq, reused)
                n = min(seq.num_tokens - reused, self.max_prefill_chunk, plan.budget)
                bm.allocate(seq, reused + n, cached)
                bm.count_external_hit(seq, reused)
            else:
                bm.allocate(seq, n, cached)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            plan.scheduled[seq] = n
            plan.budget -= n

    @staticmethod
    def _output(plan: _Plan) -> SchedulerOutput:
        block_copies = plan.block_copies
        if plan.preempted and block_copies:  # drop copies into blocks a victim gave back
            live = {b for s in plan.scheduled for b in s.block_table}
            block_copies = [(src, dst) for src, dst in block_copies if dst in live]
        for seq, d in plan.drafts.items():  # the runner verifies exactly d of them
            del seq.spec_token_ids[d:]
            if seq.spec_probs is not None:
                seq.spec_probs = seq.spec_probs[:d]
        decodes = [s for s, n in plan.scheduled.items() if n == 1]
        seqs = decodes + [s for s, n in plan.scheduled.items() if n != 1]
        return SchedulerOutput(seqs, [plan.scheduled[s] for s in seqs], len(decodes), plan.preempted,
                               block_copies, plan.finished, [plan.drafts.get(s, 0) for s in seqs])

    def _num_drafts(self, seq: Sequence, n: int, budget: int) -> int:
        """How many of seq's drafts this step verifies: only after a decode's one known token, and
        never past the budget, max_tokens or the context (d drafts can yield d + 1 tokens)."""
        if n != 1 or not seq.spec_token_ids:
            return 0
        d = min(len(seq.spec_token_ids), budget - 1, seq.max_tokens - seq.num_output_tokens - 1)
        if self.max_model_len is not None:
            d = min(d, self.max_model_len - seq.num_tokens - 1)
        return max(d, 0)

    def _room_without(self, victims: list[Sequence], seq: Sequence, n: int, cached: list[int]) -> bool:
        """Whether seq would fit once all victims gave their blocks back (so that a priority
        preemption is never in vain)."""
        bm = self.block_manager
        refs = Counter(b for v in victims for b in v.block_table)
        freed = sum(1 for b, c in refs.items() if bm.blocks[b].ref_count == c)
        return bm.num_needed_blocks(seq, n, cached) <= bm.num_free_blocks + freed

    def postprocess(self, out: SchedulerOutput, sampled_token_ids: list[list[int]]) -> None:
        """After the forward: the scheduled tokens are computed; append each sampled sequence's
        tokens (in out.seqs order: one, or a drafts' accepted prefix and one more) and offer newly
        full blocks to the prefix cache. Rejected drafts' K/V are past num_computed_tokens: the
        next step overwrites them, and blocks that held only them go back to the pool."""
        tokens = iter(sampled_token_ids)
        bm, B, running = self.block_manager, self.block_manager.block_size, SequenceStatus.RUNNING
        for seq, n, d, is_sampled in zip(out.seqs, out.num_new_tokens, out.num_spec_tokens, out.is_sampled):
            new = next(tokens) if is_sampled else ()
            if seq.status is not running:
                continue  # aborted or finished since schedule()
            accepted = len(new) - 1 if d else 0
            seq.num_computed_tokens += n - d + accepted
            if d:
                seq.num_spec_proposed += d
                seq.num_spec_accepted += accepted
                seq.clear_spec()
            if seq.num_computed_tokens // B > seq.num_hashed_blocks:
                bm.hash_blocks(seq)
            seq.token_ids.extend(new)
            if accepted < d:
                bm.trim(seq, seq.num_tokens)


@dataclass
class _Plan:
    """One step's schedule as it is built: the token budget left, the new tokens per sequence
    (in scheduling order), their drafts, and who was preempted or ended on the way."""
    budget: int
    foreground: bool = False  # a request that is not background work is running or waiting
    scheduled: dict[Sequence, int] = field(default_factory=dict)
    drafts: dict[Sequence, int] = field(default_factory=dict)
    preempted: list[Sequence] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)


def _by_key(seq: Sequence) -> tuple[int, float, int]:
    return seq.priority, seq.arrival_time, seq.seq_id


def _decodes_first(seq: Sequence) -> tuple[bool, int, float, int]:
    return len(seq.token_ids) - seq.num_computed_tokens > 1, seq.priority, seq.arrival_time, seq.seq_id
