"""A small model of the same vocabulary drafts for the target, in the same engine process.

The draft runs on Ember's own ModelRunner (kernels, paged KV) with its own pool and block manager:
each target sequence has a shadow Sequence here whose KV mirrors the target's tokens. To draft k
tokens for a batch: one forward catches every shadow up to its sequence (the tokens accepted last
step and the one after them) and yields draft 1, then k − 1 one-token forwards yield the rest, all
sequences batched. Drafts the target rejected are rolled back by moving the shadow's
num_computed_tokens back to the common prefix. Greedy requests draft the argmax (q one-hot); a
sampled request draws from the draft's softmax at the request's temperature and hands q to the
verifier (engine/sampling/verify.py), so the output stays distributed as the target's.
"""
from __future__ import annotations

import dataclasses
import logging
import time

import torch

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.kernels.tiles import TILE
from engine.layers.quant_linear import QuantLinear
from engine.sampling.sampler import argmax_rows
from engine.sampling_params import SamplingParams
from engine.scheduler_output import SchedulerOutput
from engine.sequence import Sequence
from engine.speculative.drafter import Draft
from engine.speculative.goodput import StepCosts
from engine.speculative.vocab_check import check_draft_vocab

log = logging.getLogger(__name__)
_SHADOW_PARAMS = SamplingParams(max_tokens=1 << 30)


DRAFT_HEAD_ROWS = 32768  # FR-Spec's choice for 128k-152k vocabularies
CATCH_UP_PER_TOKEN = 8  # prompt tokens the draft may catch up per reply token left (_catch_up_pays)
CATCH_UP_ANY = 256  # and always this many: a prompt chunk's worth (~0.3 s for a 0.5B draft)


def restrict_head(model, vocab_size: int, rows: int = DRAFT_HEAD_ROWS) -> int:
    """Let the draft's LM head score only the first `rows` token ids; returns how many it scores.

    FR-Spec (Zhao et al. 2025): drafts almost never come from the rare tail of a large vocabulary,
    yet the head's rows are a fifth of a 0.5B model's reads per token. BPE ids are in merge order,
    which is frequency order in the tokenizer's corpus, so the first 32k ids stand in for FR-Spec's
    frequency ranking. Exact all the same: the draft's q is its softmax over these rows (0 beyond),
    which is what the verifier divides by. Only a quantized head on the CPU is cut (it shares its
    storage: QuantLinear.first_rows), and only at a whole number of its kernels' tiles.
    """
    head = model.lm_head
    if not isinstance(head, QuantLinear) or vocab_size < 2 * rows or rows % TILE:
        return vocab_size
    model.lm_head = head.first_rows(rows)
    return rows


class DraftModelDrafter:
    name = "draft"
    shadow = False

    def __init__(self, draft_path: str, target: EngineConfig, target_vocab_size: int, num_blocks: int) -> None:
        from engine.model_runner import ModelRunner

        check_draft_vocab(target.model_path, draft_path)
        config = dataclasses.replace(target, model_path=draft_path, speculative="off", num_kv_blocks=num_blocks)
        self.runner = ModelRunner(config)
        self.vocab_size = min(target_vocab_size, self.runner.vocab_size)  # padded rows never drafted
        self.vocab_size = restrict_head(self.runner.model, self.vocab_size)
        # Its own prefix cache: a chat's next turn (or a preempted sequence) catches up from it.
        # Only blocks of the target's tokens are hashed, never blocks holding drafts.
        self.block_manager = BlockManager(self.runner.kv_capacity_blocks(), config.block_size,
                                          enable_prefix_caching=config.enable_prefix_caching,
                                          on_clean=self.runner.give_back)
        self.costs = StepCosts()  # draft forward seconds by batched tokens
        self._shadows: dict[int, Sequence] = {}
        self._generators: dict[int, torch.Generator] = {}
        log.info("draft model %s: vocab %d, %d KV blocks", draft_path, self.runner.vocab_size, num_blocks)

    def available(self, seqs: list[Sequence], max_k: int) -> list[int]:
        return [max_k if self._catch_up_pays(s) else 0 for s in seqs]

    def _catch_up_pays(self, seq: Sequence) -> bool:
        """A sequence's first draft makes the draft model read its whole prompt (later ones: the
        tokens since the last), which the per-step goodput does not see. It may be at most
        CATCH_UP_PER_TOKEN tokens per token the reply has left, or CATCH_UP_ANY: Qwen2.5-Coder-0.5B
        reads a prompt at ~1.2 ms a token against 9.6 ms for a one-token draft forward (Zen 5,
        2 threads), so 8 prompt tokens cost one draft step. Four 1,500-token extraction prompts
        with 128-token replies took 7 s to catch up and decoded at 0.2-0.5x plain; a 578-token
        code prompt still drafts."""
        sh = self._shadows.get(seq.seq_id)
        behind = seq.num_tokens - (sh.num_computed_tokens if sh is not None else 0)
        return behind <= max(CATCH_UP_PER_TOKEN * (seq.max_tokens - seq.num_output_tokens), CATCH_UP_ANY)

    def cost(self, num_seqs: int, depth: int) -> float:
        """One catch-up forward (about two tokens a sequence) and depth − 1 one-token forwards."""
        if depth <= 0:
            return 0.0
        return self.costs(2 * num_seqs) + (depth - 1) * self.costs(num_seqs)

    def _sync(self, seq: Sequence) -> Sequence | None:
        """The shadow of seq, its tokens made seq's and its KV cut back to their common prefix."""
        sh = self._shadows.get(seq.seq_id)
        if sh is None:
            sh = self._shadows[seq.seq_id] = Sequence(seq.token_ids, _SHADOW_PARAMS, seq_id=seq.seq_id)
            return sh
        # Up to the last sync's length (num_prompt_tokens) both lists agreed and seq's tokens only
        # grow, so only the drafts after it can differ.
        old, new, base = sh.token_ids, seq.token_ids, sh.num_prompt_tokens
        c = min(sh.num_computed_tokens, len(new), len(old))
        lcp = next((i for i in range(base, c) if old[i] != new[i]), c)
        sh.token_ids = list(new)
        sh.num_computed_tokens = lcp
        sh.num_prompt_tokens = len(new)
        return sh

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        shadows = [self._sync(s) for s in seqs]
        tokens: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        bm = self.block_manager
        for depth in range(max(ks)):
            group = [i for i, k in enumerate(ks) if len(tokens[i]) == depth and depth < k]
            group.sort(key=lambda i: shadows[i].num_tokens - shadows[i].num_computed_tokens > 1)  # decodes first
            live, ns = [], []
            for i in group:
                sh = shadows[i]
                if not sh.block_table:
                    if not bm.can_allocate(sh):
                        continue  # the draft's pool is full: this sequence gets no drafts now
                    bm.allocate(sh)  # its prefix-cache hits, and slots for the rest
                n = sh.num_tokens - sh.num_computed_tokens
                if not bm.can_append(sh, n):
                    continue  # the draft's pool is full: this sequence gets fewer drafts
                bm.append_slots(sh, n)
                live.append(i)
                ns.append(n)
            if not live:
                break
            out = SchedulerOutput([shadows[i] for i in live], ns, sum(n == 1 for n in ns))
            t0 = time.perf_counter()
            logits = self.runner.run_model(out)[:, :self.vocab_size]
            self.costs.observe(sum(ns), time.perf_counter() - t0)
            for row, (i, n) in enumerate(zip(live, ns)):
                tok, q = self._pick(seqs[i], logits[row])
                sh = shadows[i]
                sh.num_computed_tokens += n
                if depth == 0:  # all of token_ids are the target's own: offer full blocks to the cache
                    bm.hash_blocks(sh)
                sh.token_ids.append(tok)
                tokens[i].append(tok)
                if q is not None:
                    probs[i].append(q)
        return [Draft(t, torch.stack(p) if p and len(p) == len(t) else None) for t, p in zip(tokens, probs)]

    def _pick(self, seq: Sequence, row: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """The argmax for a greedy request (q one-hot), else a draw from softmax(row / T) and q."""
        p = seq.params
        if p.is_greedy:
            return argmax_rows(row[None])[0], None
        q = torch.softmax(row.double() / p.temperature, -1)
        gen = self._generators.get(seq.seq_id)
        if gen is None and p.seed is not None:
            gen = self._generators[seq.seq_id] = torch.Generator().manual_seed(p.seed + 1)
        return int(torch.multinomial(q, 1, generator=gen)), q

    def release(self, seq: Sequence) -> None:
        sh = self._shadows.pop(seq.seq_id, None)
        if sh is not None:
            self.block_manager.free(sh)
        if seq.is_finished:
            self._generators.pop(seq.seq_id, None)

    @property
    def memory_bytes(self) -> int:
        """Its weights and KV reservation, counted with the target's in the memory budget."""
        return (self.runner.weight_bytes or 0) + (self.runner.kv_bytes or 0)

    def close(self) -> None:
        for sh in self._shadows.values():
            self.block_manager.free(sh)
        self._shadows.clear()
        self.runner.close()
