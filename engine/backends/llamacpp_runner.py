"""The llama.cpp runner: Ember's scheduler drives llama.cpp's kernels through its low-level C API.

One `llama_context` holds every running sequence, each under its own llama `seq_id` (a slot from a
free pool, the shape of llama.cpp's server: slot id = seq_id). Each engine step becomes one
`llama_batch`: for every scheduled sequence its new tokens at positions c..c+n-1 tagged with its
seq_id, an output flag on the rows the engine samples (or scores), then one `llama_decode`.
KV memory is llama.cpp's own (f16, one unified buffer of cells shared by all sequences); the
engine's BlockManager does the admission accounting against `num_blocks * block_size` cells, and
the context starts small and is re-created larger as the chats need it, up to that many
(llamacpp_context.py), so llama.cpp is never asked for more cells than it has. Block-hash prefix caching cannot
point into llama.cpp's cells; a prompt cache of slots does its work instead (slot_cache.py): a
released slot keeps its cells, a new prompt starts from the longest prefix some slot holds (taking
an idle slot over, or sharing cells with `llama_memory_seq_cp`), and idle slots are evicted whenever
live + idle cells could overflow the buffer. A scored prompt runs in a context of its own (llamacpp_batch.py).

Same request, same answer (issue 19): on a CPU a greedy reply does not depend on what else runs.
ggml's CPU flash attention visits each row's cells in cell order, alone per row, unless a ubatch has
one row (it splits the cells across threads) or 64+ (64-cell tiles: results depend on where cells
start). Cells are only appended (llamacpp_context.py); a step with a greedy sequence is decoded in
parts of 2-63 rows (a lone row gets a padding row).
"""
from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import psutil
import torch

from engine.backends.llamacpp_batch import LlamaBatch, ScoringContext, parts
from engine.backends.llamacpp_context import FA_TILE_ROWS
from engine.backends.llamacpp_setup import (LlamaCppError, context_params, decode_error, kv_block_bytes, llama,
                                            load_model, open_context)
from engine.backends.llamacpp_vision import Vision, cut_before_image, images_ahead, position
from engine.backends.slot_cache import SlotCache
from engine.backends.slot_disk import open_slot_disk
from engine.config import EngineConfig
from engine.kv_sizing import idle_cache_tokens, num_kv_blocks
from engine.sampling.step_sampler import StepSampler
from engine.model_files.footprint import MAX_DEFAULT_CONTEXT, default_context
from engine.runner import Runner, RunnerOutput
from engine.scheduler_output import SchedulerOutput

log = logging.getLogger(__name__)


class LlamaCppRunner(Runner):
    """The Runner (engine/runner.py) over llama.cpp; its slots are the prompt cache."""

    paged_kv = False  # llama.cpp's cells: block tables do not address them
    max_scoring_seqs = 1  # a scored prompt runs alone in its own context (llamacpp_batch.py)

    def __init__(self, config: EngineConfig, *, n_gpu_layers: int = 0, flash_attn: bool = False,
                 kv_unified: bool = True, prompt_cache: bool | None = None, verbose: bool = False) -> None:
        ll = self._ll = llama()
        from llama_cpp import _logger  # llama.cpp's log callback: quiet unless verbose
        _logger.set_verbose(verbose)
        self.config = config
        path = Path(config.model_path)
        self._model = load_model(ll, path, n_gpu_layers)
        self._vocab = ll.llama_model_get_vocab(self._model)
        self.vocab_size = int(ll.llama_vocab_n_tokens(self._vocab))
        n_train = int(ll.llama_model_n_ctx_train(self._model)) or MAX_DEFAULT_CONTEXT
        self.max_model_len = default_context(n_train, config.max_model_len)

        B = config.block_size
        block_bytes = kv_block_bytes(ll, self._model, path, config)
        free = psutil.virtual_memory().available
        self.num_blocks = max(num_kv_blocks(config, block_bytes, free, self.max_model_len), 1)
        self.n_seq_max = min(config.max_num_seqs, int(ll.llama_max_parallel_sequences()) - 2)
        self.n_batch = config.max_num_batched_tokens
        exact = flash_attn and not n_gpu_layers and config.exact_greedy  # ggml-cpu's FA kernels only
        self._exact_rows = FA_TILE_ROWS - 1 if exact else 0
        threads = config.num_threads or os.cpu_count() or 1
        self.flash_attn = flash_attn
        cparams = context_params(ll, config, self.n_seq_max, self.n_batch, threads,
                                 flash_attn=flash_attn, kv_unified=kv_unified)
        self._context = open_context(ll, self._model, cparams, self.num_blocks * B)
        self._batch = LlamaBatch(ll, self.n_batch + 1)  # reused every step
        self._threads = self.num_threads = threads
        self.weight_bytes, self.kv_bytes = int(ll.llama_model_size(self._model)), self.num_blocks * block_bytes
        self._scoring: ScoringContext | None = None
        self.vision = Vision.open(ll, self._model, config, threads, n_gpu_layers != 0, self.vocab_size)

        # The prompt cache needs partial seq_rm, which recurrent/hybrid memories refuse.
        recurrent = ll.llama_model_is_recurrent(self._model) or ll.llama_model_is_hybrid(self._model)
        self.caches_prompts = (config.enable_prefix_caching if prompt_cache is None else prompt_cache) and not recurrent
        self.sampler = StepSampler()
        self.idle_cells_max = idle_cache_tokens(config, self.max_model_len)  # idle slots' cells kept
        self._slots = SlotCache(self.n_seq_max, min_match=B)
        # idle slots' cells also go to disk and come back after a restart (slot_disk.py)
        self._disk = open_slot_disk(config, ll, flash_attn, n_gpu_layers, B) if self.caches_prompts else None
        self._slot_of: dict[int, int] = {}  # engine seq_id -> llama seq_id (live slots)
        self._live: dict[int, object] = {}  # live llama seq_id -> its engine Sequence
        self._kv_len: dict[int, int] = {}  # live llama seq_id -> number of positions in llama's KV
        log.info("llama.cpp runner: %s, %d threads, KV cells %d growing to %d (%d blocks, %.1f MiB f16), "
                 "%d slots, max_model_len %d", path.name, threads, self._context.cells, self.num_blocks * B,
                 self.num_blocks, self.num_blocks * block_bytes / 2**20, self.n_seq_max, self.max_model_len)

    # ---- Runner interface ---------------------------------------------------------------------
    @property
    def _ctx(self):
        return self._context.ctx  # re-created when the context grows or shrinks

    @property
    def n_cells(self) -> int:
        """KV cells llama.cpp holds now (the context grows with the chats, up to the pool)."""
        return self._context.cells

    def kv_capacity_blocks(self) -> int:
        return self.num_blocks

    @property
    def prompt_cache(self) -> LlamaCppRunner | None:
        """The slots themselves (match_prompt, claim_prompt), unless prompt caching is off."""
        return self if self.caches_prompts else None

    @property
    def num_cached_tokens(self) -> int:
        """Tokens idle slots hold for later prompts (the prompt cache's size)."""
        return self._slots.idle_cells

    def release(self, seq) -> None:
        """The sequence is done (finished, aborted or preempted): with the prompt cache its slot
        goes idle with its cells, else they are dropped. A no-op for unknown sequences."""
        self.sampler.release(seq)
        if self._scoring is not None and self._scoring.seq_id == seq.seq_id:
            self._scoring.clear()
        slot = self._slot_of.pop(seq.seq_id, None)
        if slot is None:
            return
        self._live.pop(slot, None)
        n = self._kv_len.pop(slot, 0)
        n = n if self.caches_prompts else 0
        if n and self._disk is not None:
            self._disk.save(self._ll, self._ctx, slot, seq, n)
        if not n:
            self._clear(slot)
        self._slots.park(slot, seq.token_ids[:n])  # nothing kept: the slot is simply free
        while self._slots.idle_cells > self.idle_cells_max:  # the idle budget; the rest goes back
            self._clear(self._slots.evict_lru())
        if not self._live:
            self._context.shrink(self._slots.idle_cells, {s: len(t) for s, t in self._slots.idle.items()})
            if not self._slots.idle:
                self._context.reset()

    def match_prompt(self, seq) -> int:
        """How many leading tokens of seq some slot already holds (0 if too few to bother)."""
        if not self.caches_prompts or seq.scores_prompt:
            return 0
        m = self._match(seq)
        on_disk = self._disk.match(seq, seq.num_tokens - 1)[0] if self._disk and not seq.images else 0
        return cut_before_image(seq.images, max(m.num_tokens if m else 0, on_disk))

    def claim_prompt(self, seq, num_tokens: int) -> int:
        """Give seq a slot whose cells hold its first tokens; returns how many (<= num_tokens)."""
        m = self._match(seq)
        if self._disk is not None and not seq.images and self._disk.match(seq, num_tokens)[0] > (m.num_tokens if m else 0):
            return self._disk.claim(self, seq, num_tokens)
        if m is None:
            return 0
        n = cut_before_image(seq.images, min(num_tokens, m.num_tokens))
        if m.take_over:  # the same chat's next turn: keep the shared part, drop the slot's tail
            self._slots.take(m.slot)
            slot = m.slot
            self._context.bury(slot, position(seq.images, n))  # llama.cpp's positions
        else:  # a shared prefix (a system prompt): the cells gain this slot's id, nothing is copied
            got = self._slots.acquire(keep=m.slot)
            if got is None:
                return 0
            slot, dirty = got
            if dirty:
                self._clear(slot)
            self._ll.llama_memory_seq_cp(self._context.mem, m.slot, slot, 0, position(seq.images, n))
        self._slot_of[seq.seq_id] = slot
        self._live[slot] = seq
        self._kv_len[slot] = n
        return n

    def _match(self, seq):
        # cells past num_computed_tokens may hold rejected drafts: never a match
        live = {slot: s.token_ids[:min(self._kv_len[slot], s.num_computed_tokens)] for slot, s in self._live.items()}
        return self._slots.match(seq.token_ids, live, limit=seq.num_tokens - 1)

    def _clear(self, slot: int) -> None:
        self._context.bury(slot)  # its cells go to the grave: freeing them would leave a hole

    def _held_slots(self) -> dict[int, int]:
        """Slots whose cells hold tokens, the live ones and the idle ones: how many each."""
        return {slot: n for slot, n in self._kv_len.items() if n} | {s: len(t) for s, t in self._slots.idle.items()}

    def _make_room(self, num_new: int) -> None:
        """Room for this step's tokens at the head (llamacpp_context.py); when the pool is whole,
        idle slots are dropped, oldest first (the re-created context leaves them out). The block
        manager bounds the live cells by the pool, so dropping every idle slot always suffices."""
        live = sum(self._kv_len.values())
        while not self._context.make_room(num_new, live + num_new + self._slots.idle_cells,
                                          self._held_slots()):
            if self._slots.evict_lru() is None:
                return

    def run_model(self, out: SchedulerOutput) -> torch.Tensor:
        """One llama_decode over the scheduled sequences but those that run alone (a scored prompt, a
        chunk that reaches an image: llamacpp_vision.py); float32 logits of out.logit_rows()."""
        scored = [s.scores_prompt or images_ahead(s) for s in out.seqs]
        n = sum(k for k, x in zip(out.num_new_tokens, scored) if not x)
        if n > self.n_batch:
            raise LlamaCppError(f"step of {n} tokens exceeds n_batch {self.n_batch}")
        i, rows = 0, []  # batch indices whose logits are wanted, in seqs order
        for seq, k, m, x in zip(out.seqs, out.num_new_tokens, out.num_logits, scored):
            if x:
                continue
            slot = self._slot(seq)
            c = seq.num_computed_tokens
            self._rollback(slot, c)
            self._batch.put(i, slot, seq.new_token_ids(k), position(seq.images, c))
            rows.extend(range(i + k - m, i + k))
            i += k
        greedy = any(s.params.temperature == 0 for s, x in zip(out.seqs, scored) if not x)
        exact = self._exact_rows if greedy else 0  # rows per part: exact sums for greedy replies
        if pad := bool(exact) and n == 1:  # a lone row would take another attention kernel
            self._batch.put(n, self._context.pad, [0], 0)
        self._batch.finish(n + pad, rows)
        logits = self._decode(n + pad, rows, exact or n + pad, pad) if n else torch.empty(0, self.vocab_size)
        for seq, k, x in zip(out.seqs, out.num_new_tokens, scored):
            if not x:
                self._kv_len[self._slot_of[seq.seq_id]] = seq.num_computed_tokens + k
        if not any(scored):
            return logits
        pieces = list(logits.split([0 if x else m for m, x in zip(out.num_logits, scored)]))
        for j in (j for j, x in enumerate(scored) if x):  # each one's rows at its place
            s, k, m = out.seqs[j], out.num_new_tokens[j], out.num_logits[j]
            if images_ahead(s):
                pieces[j] = self.vision.prefill(self, s, k, m)
                continue
            if self._scoring is None:  # made at the first scored prompt
                self._scoring = ScoringContext(self._ll, self._model, self.max_model_len, self.n_batch,
                                               self._threads, self.flash_attn, self.vocab_size)
            pieces[j] = self._scoring.run(s, k, m)
        return torch.cat(pieces)

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        return self.sampler(out, self.run_model(out))

    # ---- helpers ------------------------------------------------------------------------------
    def _slot(self, seq) -> int:
        slot = self._slot_of.get(seq.seq_id)
        if slot is None:
            got = self._slots.acquire()
            if got is None:
                raise LlamaCppError(f"all {self.n_seq_max} llama.cpp sequence slots are in use "
                                    "(max_num_seqs bounds the running sequences)")
            slot, dirty = got
            if dirty:
                self._clear(slot)
            self._slot_of[seq.seq_id] = slot
            self._live[slot] = seq
            self._kv_len[slot] = 0
        return slot

    def _rollback(self, slot: int, c: int) -> None:
        """Make llama's KV for this slot hold exactly positions [0, c): drop anything past c
        (speculative rollback, recompute); KV the engine thinks is computed must exist."""
        have = self._kv_len[slot]
        if c > have:
            raise LlamaCppError(f"sequence expects {c} computed tokens but llama.cpp holds {have} "
                                "(prefix caching must be off with the llama.cpp runner)")
        if c < have:
            self._context.bury(slot, position(self._live[slot].images, c))
            self._kv_len[slot] = c

    def _decode(self, n: int, rows: list[int], most: int, padded: bool) -> torch.Tensor:
        """llama_decode the batch's n rows at the head in parts of at most `most`; rows' logits."""
        self._make_room(n)
        out = []  # logits of each part's rows, read before the next decode overwrites them
        for a, b in parts(n, most):  # one part (most >= n): the batch itself
            batch = self._batch.view(a, b) if b - a < n else self._batch.batch
            if ret := self._ll.llama_decode(self._ctx, batch):
                raise decode_error(ret, b - a, self.n_cells)
            out.append(self._batch.logits(self._ctx, [r for r in rows if a <= r < b], self.vocab_size, a))
        self._context.placed(n, padded)
        return torch.cat(out)

    # ---- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Free the projector, the disk tier's writer, the scoring context, batch, context and model (idempotent)."""
        for name, free in (("vision", "close"), ("_disk", "close"), ("_scoring", "close"), ("_batch", "free"),
                           ("_context", "close")):
            if (part := getattr(self, name, None)) is not None:
                getattr(part, free)()
                setattr(self, name, None)
        if getattr(self, "_model", None):
            self._ll.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
