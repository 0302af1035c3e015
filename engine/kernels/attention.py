"""Paged-attention decode through Ember's C++ kernel (csrc/paged_attention.cpp).

The kernel reads each sequence's K/V rows in place through its block table (no gathered copy
of the context, no padding mask) and does softmax(q K^T scale) V in one pass with a running
max and sum, in float32 whatever the cache dtype. engine/layers/attention.py uses it for the
decode rows of a step on a CPU and keeps gather + SDPA for the rest (and for GPUs).
"""
from __future__ import annotations

import functools

import torch

from engine.kernels import CpuPath, default_path, kernels

KV_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int8)  # int8: q8_0 rows (kv_quant.cpp)


@functools.cache
def _has_op() -> bool:
    """The library loads and holds the op (a library built before the kernel existed does not)."""
    ops = kernels()
    return ops is not None and hasattr(ops, "paged_attention_decode")


def decode_kernel_available(k_cache: torch.Tensor) -> bool:
    """Whether paged_decode can serve this pool: a CPU tensor of a supported dtype and head_dim."""
    return (k_cache.device.type == "cpu" and k_cache.dtype in KV_DTYPES and head_dim(k_cache) % 16 == 0
            and _has_op())


def head_dim(cache: torch.Tensor) -> int:
    """Values per row: a q8_0 row (int8) holds D codes and D/32 float16 scales, D + D/16 bytes."""
    return cache.shape[-1] // 17 * 16 if cache.dtype == torch.int8 else cache.shape[-1]


def q8_rows(x: torch.Tensor) -> torch.Tensor:
    """float [..., D] -> the q8_0 rows a pool of int8 holds."""
    return kernels().kv_q8(x)


def q8_values(rows: torch.Tensor) -> torch.Tensor:
    """q8_0 rows int8 [..., D + D/16] -> float32 [..., D], exactly the values the kernel reads."""
    return kernels().kv_q8_dequant(rows)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, scale: float, path: CpuPath = CpuPath.NONE, window: int = 0,
                 sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [S, H, hd] (one token per sequence), pools [num_blocks, B, n_kv, hd], block_tables int64
    [S, >= ceil(seq_len / B)], seq_lens int64 [S] -> float32 [S, H, hd]. path NONE: the best one
    (or the one EMBER_CPU_PATH names, as for the quantized linears). window > 0: only the last
    `window` keys of each sequence are read (a sliding-window layer). sinks: float32 [H], each
    head's sink logit (gpt-oss), or None."""
    return kernels().paged_attention_decode(q.float().contiguous(), k_cache, v_cache, block_tables, seq_lens,
                                            float(scale), int(path or default_path()), int(window), sinks)
