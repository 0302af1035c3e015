"""The llama.cpp runner: Ember's scheduler drives llama.cpp's kernels through its low-level C API.

One `llama_context` holds every running sequence, each under its own llama `seq_id` (a slot from a
free pool, the shape of llama.cpp's server: slot id = seq_id). Each engine step becomes one
`llama_batch`: for every scheduled sequence its new tokens at positions c..c+n-1 tagged with its
seq_id, an output flag on the rows the engine samples (or scores), then one `llama_decode`.
KV memory is llama.cpp's own (f16, one unified buffer of `num_blocks * block_size` cells shared by
all sequences); the engine's BlockManager does the admission accounting against the same number of
blocks, so llama.cpp is never asked for more cells than it has. Prefix caching stays off: llama.cpp
cells are not addressed by the engine's block tables. `release` drops a sequence's cells with
`llama_memory_seq_rm(mem, seq_id, 0, -1)` and returns its slot (finish, abort, preempt-by-recompute).
"""
from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import numpy as np
import psutil
import torch

from engine.config import EngineConfig
from engine.model_runner import num_kv_blocks

log = logging.getLogger(__name__)

MAX_DEFAULT_CONTEXT = 4096  # as the torch ModelRunner: the model's context, capped, unless configured
KV_ITEMSIZE = 2  # llama.cpp's default KV type is f16


class LlamaCppError(RuntimeError):
    """llama.cpp refused a batch or a model; the message says which and why."""


def _llama():
    import llama_cpp  # imported lazily: engine modules that never use this backend need not load it
    return llama_cpp


class LlamaCppRunner:
    """Runner interface over llama.cpp: `execute(out) -> f32 logits [rows, vocab]`, `release(seq)`,
    `vocab_size`, `max_model_len`, `kv_capacity_blocks()`."""

    supports_prefix_caching = False

    def __init__(self, config: EngineConfig, *, n_gpu_layers: int = 0, flash_attn: bool = False,
                 kv_unified: bool = True, verbose: bool = False) -> None:
        ll = self._ll = _llama()
        from llama_cpp import _logger  # llama.cpp's log callback: quiet unless verbose
        _logger.set_verbose(verbose)
        self.config = config
        path = Path(config.model_path)
        if not path.is_file():
            raise LlamaCppError(f"model file not found: {path}")
        ll.llama_backend_init()

        mparams = ll.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        self._model = ll.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise LlamaCppError(f"llama.cpp could not load {path} (not a GGUF it supports?)")
        self._vocab = ll.llama_model_get_vocab(self._model)
        self.vocab_size = int(ll.llama_vocab_n_tokens(self._vocab))
        n_train = int(ll.llama_model_n_ctx_train(self._model)) or MAX_DEFAULT_CONTEXT
        self.max_model_len = min(config.max_model_len or min(n_train, MAX_DEFAULT_CONTEXT), n_train)

        # Size the unified KV buffer like the torch pool: a fraction of free RAM, capped, and never
        # less than one full-length sequence. Cells = blocks * block_size (the engine's accounting).
        B = config.block_size
        n_layer = int(ll.llama_model_n_layer(self._model))
        n_embd = int(ll.llama_model_n_embd(self._model))
        n_head = int(ll.llama_model_n_head(self._model))
        n_head_kv = int(ll.llama_model_n_head_kv(self._model))
        self.kv_bytes_per_token = 2 * n_layer * n_head_kv * (n_embd // n_head) * KV_ITEMSIZE
        self.num_blocks = self._num_blocks(config, self.kv_bytes_per_token * B)
        self.n_seq_max = min(config.max_num_seqs, int(ll.llama_max_parallel_sequences()))
        self.n_batch = config.max_num_batched_tokens

        cparams = ll.llama_context_default_params()
        cparams.n_ctx = self.num_blocks * B
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = min(self.n_batch, 512)
        cparams.n_seq_max = self.n_seq_max
        cparams.kv_unified = kv_unified  # one cell pool for all sequences, as the engine's block pool
        threads = config.num_threads or os.cpu_count() or 1
        cparams.n_threads = cparams.n_threads_batch = threads
        self.flash_attn = flash_attn
        cparams.flash_attn_type = (ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                                   else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        cparams.no_perf = True
        self._ctx = ll.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            ll.llama_model_free(self._model)
            raise LlamaCppError(f"llama.cpp could not create a context of {cparams.n_ctx} cells "
                                "(out of memory? try a smaller --max-model-len or KV fraction)")
        self._mem = ll.llama_get_memory(self._ctx)
        # One reusable batch of up to n_batch tokens, one seq_id per token.
        self._batch = ll.llama_batch_init(self.n_batch, 0, 1)
        self._token = np.ctypeslib.as_array(self._batch.token, shape=(self.n_batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(self.n_batch,))
        self._n_seq_id = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(self.n_batch,))
        self._logits_flag = np.ctypeslib.as_array(self._batch.logits, shape=(self.n_batch,))
        self._seq_id_rows = [self._batch.seq_id[i] for i in range(self.n_batch)]
        self._n_seq_id[:] = 1

        self._free_slots = list(range(self.n_seq_max - 1, -1, -1))  # pop() hands out 0 first
        self._slot_of: dict[int, int] = {}  # engine seq_id -> llama seq_id
        self._kv_len: dict[int, int] = {}  # llama seq_id -> number of positions in llama's KV
        log.info("llama.cpp runner: %s, %d threads, %d KV cells (%d blocks, %.1f MiB f16), "
                 "%d slots, max_model_len %d", path.name, threads, cparams.n_ctx, self.num_blocks,
                 self.num_blocks * B * self.kv_bytes_per_token / 2**20, self.n_seq_max,
                 self.max_model_len)

    def _num_blocks(self, config: EngineConfig, block_bytes: int) -> int:
        """Sized like the torch pool, so the block manager's admission matches llama.cpp's cells."""
        return max(num_kv_blocks(config, block_bytes, psutil.virtual_memory().available, self.max_model_len), 1)

    # ---- Runner interface ---------------------------------------------------------------------
    def kv_capacity_blocks(self) -> int:
        return self.num_blocks

    def release(self, seq) -> None:
        """Drop the sequence's KV cells and return its slot; a no-op for unknown sequences."""
        slot = self._slot_of.pop(seq.seq_id, None)
        if slot is None:
            return
        self._ll.llama_memory_seq_rm(self._mem, slot, 0, -1)  # whole sequence: never fails
        self._kv_len.pop(slot, None)
        self._free_slots.append(slot)

    def execute(self, out) -> torch.Tensor:
        """One llama_decode over every scheduled sequence; float32 logits, one row per sampled
        sequence in `out.seqs` order (every new token's row for prompt-logprob sequences)."""
        n = sum(out.num_new_tokens)
        if n > self.n_batch:
            raise LlamaCppError(f"step of {n} tokens exceeds n_batch {self.n_batch}")
        rows: list[int] = []  # batch indices whose logits the engine wants, in seqs order
        i = 0
        for seq, k in zip(out.seqs, out.num_new_tokens):
            slot = self._slot(seq)
            c = seq.num_computed_tokens
            self._rollback(slot, c)
            self._token[i:i + k] = seq.token_ids[c:c + k]
            self._pos[i:i + k] = np.arange(c, c + k)
            for row in range(i, i + k):
                self._seq_id_rows[row][0] = slot
            self._logits_flag[i:i + k] = 0
            if getattr(seq.params, "prompt_logprobs", None) is not None:
                self._logits_flag[i:i + k] = 1
                rows.extend(range(i, i + k))
            elif c + k == seq.num_tokens:
                self._logits_flag[i + k - 1] = 1
                rows.append(i + k - 1)
            i += k
        self._batch.n_tokens = n
        if n:
            self._decode()
        for seq, k in zip(out.seqs, out.num_new_tokens):
            self._kv_len[self._slot_of[seq.seq_id]] = seq.num_computed_tokens + k
        return self._gather_logits(rows)

    # ---- helpers ------------------------------------------------------------------------------
    def _slot(self, seq) -> int:
        slot = self._slot_of.get(seq.seq_id)
        if slot is None:
            if not self._free_slots:
                raise LlamaCppError(f"all {self.n_seq_max} llama.cpp sequence slots are in use "
                                    "(max_num_seqs bounds the running sequences)")
            slot = self._slot_of[seq.seq_id] = self._free_slots.pop()
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
            if not self._ll.llama_memory_seq_rm(self._mem, slot, c, -1):
                raise LlamaCppError(f"llama.cpp could not roll back sequence slot {slot} to {c}")
            self._kv_len[slot] = c

    def _decode(self) -> None:
        ret = self._ll.llama_decode(self._ctx, self._batch)
        if ret == 0:
            return
        # On 1 (and -1) llama.cpp restores the memory state to what it was before the call.
        if ret == 1:
            raise LlamaCppError(
                f"llama.cpp found no KV slot for a batch of {self._batch.n_tokens} tokens "
                f"({self.num_blocks * self.config.block_size} cells); lower max_num_seqs or "
                "max_model_len, or raise the KV memory fraction")
        if ret == 2:
            raise LlamaCppError("llama_decode was aborted")
        if ret == -1:
            raise LlamaCppError("llama_decode rejected the batch as invalid (positions/seq ids)")
        raise LlamaCppError(f"llama_decode failed with code {ret}")

    def _gather_logits(self, rows: list[int]) -> torch.Tensor:
        V = self.vocab_size
        logits = torch.empty(len(rows), V, dtype=torch.float32)
        for r, i in enumerate(rows):
            ptr = self._ll.llama_get_logits_ith(self._ctx, i)
            if not ptr:
                raise LlamaCppError(f"llama.cpp has no logits for batch row {i}")
            ctypes.memmove(logits[r].data_ptr(), ptr, V * 4)
        return logits

    # ---- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Free the batch, context and model (idempotent)."""
        ll = self._ll
        if getattr(self, "_batch", None) is not None:
            ll.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            ll.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            ll.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> "LlamaCppRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
