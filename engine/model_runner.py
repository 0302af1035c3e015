"""Owns the weights and the paged KV pool; turns a scheduled batch into one forward pass.

Inputs are flattened nano-vllm style: the new tokens of every scheduled sequence, decodes
first, form one [T] batch. For sequence i with n new tokens starting at position c
(= its num_computed_tokens), token j sits at position c + j and its K/V go to slot
``block_table[(c+j) // B] * B + (c+j) % B``.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence as Seq

import psutil
import torch

from engine.backends.device import auto_dtype, cpu_has_fast_bf16
from engine.config import EngineConfig
from engine.layers.attention import AttentionMetadata
from engine.loaders.gguf_loader import load_model

log = logging.getLogger(__name__)

MAX_DEFAULT_CONTEXT = 4096


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """A dtype name as torch's; `auto` (a runner built directly, not through engine.backends.decide)
    by the same rule the decision uses."""
    if name == "auto":
        name = auto_dtype(device.type, cpu_has_fast_bf16())
    return getattr(torch, name)


def kv_bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                       itemsize: int) -> int:
    """K and V, every layer: 2 · L · B · n_kv · hd · itemsize."""
    return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize


def free_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


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


def prompt_logprob_rows(seq) -> bool:
    return getattr(seq.params, "prompt_logprobs", None) is not None


class ModelRunner:
    def __init__(self, config: EngineConfig, model: torch.nn.Module | None = None) -> None:
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.model = model if model is not None else load_model(config.model_path, self.dtype, self.device)
        self.model.eval()
        mc = self.model_config = self.model.config
        self.vocab_size = mc.vocab_size
        ctx = mc.context_length or MAX_DEFAULT_CONTEXT
        self.max_model_len = min(config.max_model_len or min(ctx, MAX_DEFAULT_CONTEXT), ctx)
        B = config.block_size
        block_bytes = kv_bytes_per_block(mc.num_layers, B, mc.num_kv_heads, mc.head_dim,
                                         self.dtype.itemsize)
        self.num_blocks = num_kv_blocks(config, block_bytes, free_memory_bytes(self.device), self.max_model_len)
        shape = (self.num_blocks, B, mc.num_kv_heads, mc.head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                           torch.zeros(shape, dtype=self.dtype, device=self.device))
                          for _ in range(mc.num_layers)]
        log.info("KV pool: %d blocks of %d tokens (%.1f MiB), max_model_len %d",
                 self.num_blocks, B, self.num_blocks * block_bytes / 2**20, self.max_model_len)

    def kv_capacity_blocks(self) -> int:
        return self.num_blocks

    def release(self, seq) -> None:
        """The pool is shared and addressed by block tables; nothing to drop per sequence."""

    def copy_blocks(self, pairs: Seq[tuple[int, int]]) -> None:
        """Copy-on-write for forked sequences: duplicate src block into dst in every layer."""
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        for k, v in self.kv_caches:
            k[dst] = k[src]
            v[dst] = v[src]

    def prepare(self, out) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        B = self.config.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start = [0]
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        logit_rows: list[int] = []
        for seq, n in zip(out.seqs, out.num_new_tokens):
            c = seq.num_computed_tokens
            table = seq.block_table
            input_ids.extend(seq.token_ids[c:c + n])
            positions.extend(range(c, c + n))
            slots.extend(table[p // B] * B + p % B for p in range(c, c + n))
            start = query_start[-1]
            if prompt_logprob_rows(seq):
                logit_rows.extend(range(start, start + n))
            elif c + n == seq.num_tokens:
                logit_rows.append(start + n - 1)
            query_start.append(start + n)
            seq_lens.append(c + n)
            tables.append(table)
        width = max(len(t) for t in tables)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            query_start_loc=query_start,
            seq_lens=seq_lens,
            block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long, device=dev),
            num_decodes=out.num_decodes,
            decode_seq_lens=torch.tensor(seq_lens[:out.num_decodes], dtype=torch.long, device=dev),
        )
        return (torch.tensor(input_ids, dtype=torch.long, device=dev),
                torch.tensor(positions, dtype=torch.long, device=dev), meta,
                torch.tensor(logit_rows, dtype=torch.long, device=dev))

    @torch.inference_mode()
    def execute(self, out) -> torch.Tensor:
        """Logits (float32, on CPU) for every row the engine samples or scores, in seqs order:
        all new tokens of a sequence that asks for prompt logprobs, otherwise the last new
        token of each sequence whose known tokens are all computed after this step."""
        self.copy_blocks(out.block_copies)
        input_ids, positions, meta, rows = self.prepare(out)
        hidden = self.model(input_ids, positions, self.kv_caches, meta)
        if rows.numel() == 0:
            return torch.empty(0, self.vocab_size)
        return self.model.compute_logits(hidden[rows]).float().cpu()
