"""A reusable `llama_batch` and the context of its own that a scored prompt runs in.

Why a second context (issue 19): ggml sums a sequence's attention in an order that depends on
where its KV cells lie and on the ubatch's row count (flash attention: one row splits the cells
across threads, 64+ rows use 64-cell tiles; without it, SIMD lanes of cell index mod 16 or 64),
up to 1.7 logits apart on the bundled model, and in the runner's shared context both depend on
what else runs and what idle slots hold. A request that asks for its
prompt's logprobs (echo, scoring, evaluation) therefore runs alone in `ScoringContext`: cleared
before it starts, so its cells start at 0, its chunks start at multiples of max_prefill_chunk
(scheduler.py), and its rows start each batch. Its scores are then the same every time, bit for
bit, and within 2e-5 of llama.cpp's for the text decoded alone in one batch.
"""
from __future__ import annotations

import ctypes

import numpy as np
import torch


def parts(n: int, most: int) -> list[tuple[int, int]]:
    """Rows [0, n) as [start, end) ranges of near-equal size, at most `most` rows each (so at
    least two each when n >= 2 and most >= 3)."""
    k = -(-n // most)
    bounds = [n * j // k for j in range(k + 1)]
    return list(zip(bounds, bounds[1:]))


class LlamaBatch:
    """One `llama_batch` of up to `capacity` tokens, one seq_id each, filled in place."""

    def __init__(self, ll, capacity: int) -> None:
        self._ll, self.capacity = ll, capacity
        self.batch = ll.llama_batch_init(capacity, 0, 1)
        self.token = np.ctypeslib.as_array(self.batch.token, shape=(capacity,))
        self.pos = np.ctypeslib.as_array(self.batch.pos, shape=(capacity,))
        self.logits_flag = np.ctypeslib.as_array(self.batch.logits, shape=(capacity,))
        np.ctypeslib.as_array(self.batch.n_seq_id, shape=(capacity,))[:] = 1
        self._seq_id_rows = [self.batch.seq_id[i] for i in range(capacity)]

    def put(self, i: int, seq_id: int, tokens: list[int], start_pos: int) -> None:
        """Rows i.. hold `tokens` of llama sequence `seq_id` at positions start_pos.."""
        k = len(tokens)
        self.token[i:i + k] = tokens
        self.pos[i:i + k] = np.arange(start_pos, start_pos + k)
        for row in range(i, i + k):
            self._seq_id_rows[row][0] = seq_id

    def finish(self, n: int, rows: list[int]) -> None:
        """n tokens in all; logits wanted for `rows`."""
        self.logits_flag[:n] = 0
        self.logits_flag[rows] = 1
        self.batch.n_tokens = n

    def view(self, start: int, end: int):
        """A llama_batch of rows [start, end) of this one (same memory), for a decode of its own."""
        b = type(self.batch)()
        for name, ptype in type(self.batch)._fields_:
            if name != "n_tokens":
                ptr = getattr(self.batch, name)
                setattr(b, name, ctypes.cast(ctypes.addressof(ptr.contents) + start * ctypes.sizeof(
                    ptype._type_), ptype) if ptr else ptr)
        b.n_tokens = end - start
        return b

    def logits(self, ctx, rows: list[int], vocab_size: int, first: int = 0) -> torch.Tensor:
        """float32 [len(rows), V] after llama_decode of the rows from `first` on."""
        out = torch.empty(len(rows), vocab_size, dtype=torch.float32)
        for r, i in enumerate(rows):
            ptr = self._ll.llama_get_logits_ith(ctx, i - first)
            if not ptr:
                raise RuntimeError(f"llama.cpp has no logits for batch row {i}")
            ctypes.memmove(out[r].data_ptr(), ptr, vocab_size * 4)
        return out

    def free(self) -> None:
        if self.batch is not None:
            self._ll.llama_batch_free(self.batch)
            self.batch = None


class ScoringContext:
    """A one-sequence llama_context (made at the first scored prompt) for that prompt's request."""

    def __init__(self, ll, model, n_ctx: int, n_batch: int, threads: int, flash_attn: bool,
                 vocab_size: int) -> None:
        cparams = ll.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = n_ctx, n_batch, min(n_batch, 512)
        cparams.n_seq_max = 1
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.no_perf = True
        self._ll, self.vocab_size = ll, vocab_size
        self._ctx = ll.llama_init_from_model(model, cparams)
        if not self._ctx:
            raise RuntimeError(f"llama.cpp could not create a scoring context of {n_ctx} cells")
        self._mem = ll.llama_get_memory(self._ctx)
        self._batch = LlamaBatch(ll, n_batch)
        self.seq_id: int | None = None  # the engine sequence that lives here
        self.kv_len = 0

    def run(self, seq, k: int, num_logits: int) -> torch.Tensor:
        """Compute seq's next k tokens here; the logits of the last num_logits of them."""
        if self.seq_id != seq.seq_id:
            self.clear()
            self.seq_id = seq.seq_id
        c = seq.num_computed_tokens
        if c != self.kv_len:  # a rollback (recompute from 0 after preemption clears it instead)
            if c > self.kv_len or not self._ll.llama_memory_seq_rm(self._mem, 0, c, -1):
                raise RuntimeError(f"scoring context holds {self.kv_len} tokens, sequence expects {c}")
            self.kv_len = c
        rows = list(range(k - num_logits, k))
        self._batch.put(0, 0, seq.token_ids[c:c + k], c)
        self._batch.finish(k, rows)
        ret = self._ll.llama_decode(self._ctx, self._batch.batch)
        if ret != 0:
            raise RuntimeError(f"llama_decode failed with code {ret} in the scoring context")
        self.kv_len = c + k
        return self._batch.logits(self._ctx, rows, self.vocab_size)

    def clear(self) -> None:
        """Empty: the next sequence's cells start at 0 (llama_memory_clear resets the head)."""
        self._ll.llama_memory_clear(self._mem, True)
        self.seq_id, self.kv_len = None, 0

    def close(self) -> None:
        self._batch.free()
        if self._ctx:
            self._ll.llama_free(self._ctx)
            self._ctx = None
