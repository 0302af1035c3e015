"""How much memory the engine takes for a context and a number of chats. No torch.

One rule for the KV pool that both runners size themselves by (engine/kv_sizing.py calls
`kv_pool_blocks`), and the estimate Settings and the model manager show from the same numbers:
    pool   = min(fraction × free memory, cap) / block bytes, at most chats × context tokens,
             at least one full context
    memory = weights + KV of the tokens the chats hold (at most the pool) + the runtime
The pool is an upper bound, not a reservation of RAM: the torch runner's pages are committed as
chats write them and given back when they end; llama.cpp's context grows with the chats too.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.model_files.footprint import GiB, MiB, RUNTIME_OVERHEAD_BYTES, ModelFootprint, kv_itemsize

DEFAULT_BLOCK_SIZE = 16  # tokens per KV block (EngineConfig.block_size)
DEFAULT_KV_FRACTION = 0.25  # share of free memory the pool may grow to (EngineConfig.kv_memory_fraction)
KV_CACHE_MAX_BYTES = 1 << 30  # cap on the pool (EngineConfig.kv_cache_max_bytes)


def kv_pool_blocks(block_bytes: int, free_bytes: int, max_model_len: int, max_num_seqs: int, *,
                   block_size: int = DEFAULT_BLOCK_SIZE, kv_memory_fraction: float = DEFAULT_KV_FRACTION,
                   kv_cache_max_bytes: int = KV_CACHE_MAX_BYTES) -> int:
    """Pool size from the memory left after the weights: a fraction of what is free, capped;
    never below what one full-length sequence needs (else nothing could run) and never above
    what max_num_seqs full-length sequences could use (a tiny model would otherwise get
    millions of slots)."""
    per_seq = -(-max_model_len // block_size)
    budget = min(int(free_bytes * kv_memory_fraction), kv_cache_max_bytes)
    return max(min(budget // block_bytes, max_num_seqs * per_seq), per_seq)


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """What the engine holds, in bytes: always the weights and the runtime, and KV as chats fill it."""
    weights_bytes: int
    kv_bytes_per_token: int
    kv_max_bytes: int  # the pool: KV when every chat holds a full context (or the cap binds)
    runtime_bytes: int = RUNTIME_OVERHEAD_BYTES

    @property
    def idle_bytes(self) -> int:
        return self.weights_bytes + self.runtime_bytes

    @property
    def max_bytes(self) -> int:
        return self.idle_bytes + self.kv_max_bytes

    def with_tokens(self, tokens: int) -> int:
        """Memory while the chats hold `tokens` tokens in all."""
        return self.idle_bytes + min(tokens * self.kv_bytes_per_token, self.kv_max_bytes)


def engine_memory(fp: ModelFootprint, backend: str, dtype: str, context: int, chats: int, free_bytes: int,
                  kv_memory_fraction: float = DEFAULT_KV_FRACTION) -> MemoryEstimate:
    """The estimate for `chats` chats of `context` tokens, by the pool rule the engine loads with."""
    per_token = fp.kv_bytes_per_token(kv_itemsize(backend, dtype))
    if not per_token:
        return MemoryEstimate(fp.weights_bytes, 0, 0)
    room = max(free_bytes - fp.weights_bytes, 0)  # the engine measures free memory after its weights
    blocks = kv_pool_blocks(DEFAULT_BLOCK_SIZE * per_token, room, context, chats,
                            kv_memory_fraction=kv_memory_fraction)
    return MemoryEstimate(fp.weights_bytes, per_token, blocks * DEFAULT_BLOCK_SIZE * per_token)


def describe(est: MemoryEstimate, context: int, chats: int) -> str:
    """One line for Settings and the model manager."""
    if not est.kv_bytes_per_token:
        return f"weights {_size(est.weights_bytes)}; KV size unknown"
    return (f"up to {_size(est.max_bytes)} with {chats} chats of {context} tokens: weights "
            f"{_size(est.weights_bytes)} + KV up to {_size(est.kv_max_bytes)} ({est.kv_bytes_per_token // 1024} "
            f"KiB a token, taken as the chats fill it) + at most {_size(est.runtime_bytes)} for the runtime")


def _size(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"
