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

KV_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def _has_op() -> bool:
    """The library loads and holds the op (a library built before the kernel existed does not)."""
    ops = kernels()
    return ops is not None and hasattr(ops, "paged_attention_decode")


def decode_kernel_available(k_cache: torch.Tensor) -> bool:
    """Whether paged_decode can serve this pool: a CPU tensor of a supported dtype and head_dim."""
    return (k_cache.device.type == "cpu" and k_cache.dtype in KV_DTYPES and k_cache.shape[-1] % 16 == 0
            and _has_op())


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, scale: float, path: CpuPath = CpuPath.NONE) -> torch.Tensor:
    """q [S, H, hd] (one token per sequence), pools [num_blocks, B, n_kv, hd], block_tables int64
    [S, >= ceil(seq_len / B)], seq_lens int64 [S] -> float32 [S, H, hd]. path NONE: the best one
    (or the one EMBER_CPU_PATH names, as for the quantized linears)."""
    return kernels().paged_attention_decode(q.float().contiguous(), k_cache, v_cache, block_tables, seq_lens,
                                            float(scale), int(path or default_path()))
