"""How many KV blocks a runner allocates: the pool-sizing arithmetic both runners share. No torch.

The block manager admits sequences against this number, so the torch pool and llama.cpp's cell
buffer must be sized by the same rule; the runners only measure what is free.
"""
from __future__ import annotations

from engine.config import EngineConfig
from engine.model_files.fit import kv_bytes_per_token


def kv_bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                       itemsize: int) -> int:
    """`block_size` tokens of KV (the per-token rule is the fit rule's, model_files/fit.py)."""
    return block_size * kv_bytes_per_token(num_layers, num_kv_heads, head_dim, itemsize)


def num_kv_blocks(config: EngineConfig, block_bytes: int, free_bytes: int, max_model_len: int) -> int:
    """Pool size from the memory left after the weights: a fraction of what is free, capped;
    never below what one full-length sequence needs (else nothing could run) and never above
    what max_num_seqs full-length sequences could use (a tiny model would otherwise get
    millions of slots)."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    per_seq = -(-max_model_len // config.block_size)
    budget = min(int(free_bytes * config.kv_memory_fraction), config.kv_cache_max_bytes)
    return max(min(budget // block_bytes, config.max_num_seqs * per_seq), per_seq)
