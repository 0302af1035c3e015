"""How many KV blocks a runner allocates: the pool-sizing arithmetic both runners share. No torch.

The block manager admits sequences against this number, so the torch pool and llama.cpp's cell
buffer must be sized by the same rule; the runners only measure what is free.
"""
from __future__ import annotations

from engine.config import EngineConfig
from engine.model_files.footprint import kv_bytes_per_token
from engine.model_files.memory import kv_pool_blocks


def kv_bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                       itemsize: int, value_head_dim: int = 0) -> int:
    """`block_size` tokens of KV (the per-token rule is the fit rule's, model_files/fit.py)."""
    return block_size * kv_bytes_per_token(num_layers, num_kv_heads, head_dim, itemsize, value_head_dim)


def num_kv_blocks(config: EngineConfig, block_bytes: int, free_bytes: int, max_model_len: int) -> int:
    """The pool for this config (engine/model_files/memory.py's rule, which Settings shows too),
    unless a fixed number of blocks is asked for."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    return kv_pool_blocks(block_bytes, free_bytes, max_model_len, config.max_num_seqs,
                          block_size=config.block_size, kv_memory_fraction=config.kv_memory_fraction,
                          kv_cache_max_bytes=config.kv_cache_max_bytes)


def idle_cache_tokens(config: EngineConfig, max_model_len: int) -> int:
    """KV tokens finished sequences may keep for later prompts (the torch runner's cached free
    blocks, llama.cpp's idle slots); beyond it their memory goes back to the system."""
    return max_model_len if config.kv_idle_cache_tokens is None else config.kv_idle_cache_tokens
