"""Owns the weights and the paged KV pool; turns a scheduled batch into one forward pass.

Inputs are flattened nano-vllm style: the new tokens of every scheduled sequence, decodes
first, form one [T] batch. For sequence i with n new tokens starting at position c
(= its num_computed_tokens), token j sits at position c + j and its K/V go to slot
``block_table[(c+j) // B] * B + (c+j) % B``.
"""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence as Seq
from pathlib import Path

import psutil
import torch

from engine.config import EngineConfig
from engine.kv_pool import KVPool
from engine.kv_sizing import kv_bytes_per_block, num_kv_blocks
from engine.layers.attention import AttentionMetadata
from engine.sampling.step_sampler import StepSampler
from engine.loaders.load import load_model
from engine.model_files.fit import auto_dtype, cpu_has_fast_bf16
from engine.model_files.footprint import MAX_DEFAULT_CONTEXT, default_context
from engine.runner import Runner, RunnerOutput
from engine.scheduler_output import SchedulerOutput

log = logging.getLogger(__name__)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """A dtype name as torch's; `auto` (a runner built directly, not through engine.backends.decide)
    by the same rule the decision uses."""
    if name == "auto":
        name = auto_dtype(device.type, cpu_has_fast_bf16())
    return getattr(torch, name)


def resolve_weights(name: str, device: torch.device, dtype: torch.dtype = torch.float32) -> bool:
    """Whether the weights stay quantized: `auto` means yes on a CPU whose kernels loaded, and
    on a CUDA GPU that runs tinygemm (sm80+, bf16: engine/layers/int4_linear.py)."""
    from engine.kernels import kernels

    if name == "dense":
        return False
    if device.type == "cuda":
        ok = torch.cuda.get_device_capability(device) >= (8, 0) and dtype == torch.bfloat16
        if name == "quantized" and not ok:
            raise RuntimeError("quantized weights on CUDA need an sm80+ GPU and bfloat16 (torch's tinygemm)")
        return ok
    if name == "auto" and device.type != "cpu":
        return False
    if kernels() is None:
        if name == "quantized":
            raise RuntimeError("quantized weights need Ember's CPU kernels, which are not available (see the log)")
        return False
    if device.type != "cpu":
        raise RuntimeError(f"quantized weights run on the CPU or CUDA, not on {device}")
    return True


def resolve_kv_dtype(name: str, dtype: torch.dtype, device: torch.device, head_dim: int) -> torch.dtype:
    """The pool's element type: the engine's dtype (auto), another float type, or int8 for q8_0
    rows (Ember's CPU kernels write and read them: engine/kernels/csrc/kv_quant.cpp)."""
    from engine.kernels import kernels

    if name == "auto":
        return dtype
    if name != "q8_0":
        return getattr(torch, name)
    if device.type != "cpu" or kernels() is None or head_dim % 32:
        raise RuntimeError("a q8_0 KV cache needs Ember's CPU kernels and head_dim a multiple of 32 "
                           f"(device {device}, head_dim {head_dim}); on llama.cpp use --backend llama.cpp")
    return torch.int8


def free_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


_threads_before: int | None = None  # torch's thread count before a runner set its own


def use_threads(n: int | None) -> None:
    """torch's threads for a runner: `n`, or None for what they were before a runner set some
    (threads are per process, and a model loaded after one with its own count must not keep it)."""
    global _threads_before
    if n:
        _threads_before = torch.get_num_threads() if _threads_before is None else _threads_before
        torch.set_num_threads(n)
    elif _threads_before is not None:
        torch.set_num_threads(_threads_before)
        _threads_before = None


class ModelRunner(Runner):
    """The Runner (engine/runner.py) over Ember's torch models and paged KV pool."""

    paged_kv = True  # the pool is the block manager's blocks
    max_scoring_seqs = None  # batch-invariant: scored prompts batch like any other
    prompt_cache = None  # block-hash prefix caching serves prefixes

    def __init__(self, config: EngineConfig, model: torch.nn.Module | None = None) -> None:
        use_threads(config.num_threads)
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.quantized = resolve_weights(config.weights, self.device, self.dtype)
        self.model = model if model is not None else load_model(config.model_path, self.dtype, self.device,
                                                                self.quantized)
        self.model.eval()
        mc = self.model.config
        self.vocab_size = mc.vocab_size
        ctx = mc.context_length or MAX_DEFAULT_CONTEXT
        self.max_model_len = default_context(ctx, config.max_model_len)
        self.model.use_context(self.max_model_len)  # LongRoPE's factors follow the context, as in llama.cpp
        B = config.block_size
        self.kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, self.dtype, self.device, mc.head_dim)
        width = mc.head_dim + mc.head_dim // 16 if self.kv_dtype == torch.int8 else mc.head_dim  # q8_0 rows
        block_bytes = kv_bytes_per_block(mc.num_layers, B, mc.num_kv_heads, width, self.kv_dtype.itemsize)
        self.num_blocks = num_kv_blocks(config, block_bytes, free_memory_bytes(self.device), self.max_model_len)
        self.kv_pool = KVPool(mc.num_layers, self.num_blocks, B, mc.num_kv_heads, width, self.kv_dtype, self.device)
        self.kv_caches = self.kv_pool.caches
        self.kv_bytes = self.num_blocks * block_bytes
        self.weight_bytes = sum(t.numel() * t.element_size() for t in  # a tied head counted once
                                {id(t): t for t in (*self.model.parameters(), *self.model.buffers())}.values())
        self.num_threads = torch.get_num_threads() if self.device.type == "cpu" else None
        self.sampler = StepSampler()
        log.info("KV pool: %d blocks of %d tokens (%.1f MiB %s), max_model_len %d", self.num_blocks, B,
                 self.num_blocks * block_bytes / 2**20,
                 "reserved, committed as written" if self.kv_pool.lazy else "allocated", self.max_model_len)

    @functools.cached_property
    def kv_identity(self) -> str | None:
        """What the KV's bytes depend on (engine/kv_disk/identity.py), read when the disk tier
        first asks; None for a model built in memory (no file to name)."""
        from engine.kernel_library import ABI
        from engine.kernels import default_path
        from engine.kv_disk.identity import model_identity

        if self.config.model_path is None or not Path(self.config.model_path).exists():
            return None
        return "\0".join(str(f) for f in (
            model_identity(self.config.model_path), self.dtype, self.kv_dtype, self.quantized, self.device.type,
            ABI, default_path().name, torch.__version__, self.max_model_len, self.model.config))

    def read_blocks(self, block_ids, window_layers: bool = True) -> list:
        return self.kv_pool.read_blocks(block_ids, None if window_layers else self._full_layers())

    def write_block(self, block_id, payload) -> bool:
        full = self._full_layers()
        if self.sliding_window and memoryview(payload).nbytes == 2 * len(full) * self.kv_pool.block_bytes:
            self.kv_pool.write_block(block_id, payload, full)  # a block out of the window: no window layers
            return False
        self.kv_pool.write_block(block_id, payload)
        return True

    def _full_layers(self) -> list[int]:
        return [i for i, w in enumerate(self.model.config.layer_windows) if not w]

    def kv_capacity_blocks(self) -> int:
        return self.num_blocks

    def give_back(self, block_ids, is_clean) -> None:
        """The block manager's on_clean: clean blocks' pages go back to the OS (engine/kv_pool.py)."""
        self.kv_pool.give_back(block_ids, is_clean)

    @property
    def sliding_window(self) -> int:
        """The window of the model's sliding-window layers (0: none); the block manager reports
        the blocks they are done with to give_back_window (engine/kv_window.py)."""
        return max(self.model.config.layer_windows, default=0)  # the widest: no layer loses a key it reads

    def give_back_window(self, block_ids, is_out) -> None:
        """The sliding-window layers' pages of blocks out of their window go back to the OS."""
        windows = self.model.config.layer_windows
        self.kv_pool.give_back(block_ids, is_out, layers=[i for i, w in enumerate(windows) if w])

    def release(self, seq) -> None:
        """The pool is shared and addressed by block tables: only the sampler's state goes."""
        self.sampler.release(seq)

    def close(self) -> None:
        """Drop the weights and the pool now (idempotent); the runner is unusable afterwards."""
        self.model = None
        self.kv_caches = []
        self.kv_pool.close()

    def copy_blocks(self, pairs: Seq[tuple[int, int]]) -> None:
        """Copy-on-write for forked sequences: duplicate src block into dst in every layer."""
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        for k, v in self.kv_caches:
            k[dst] = k[src]
            v[dst] = v[src]

    def prepare(self, out: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        B = self.config.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start = [0]
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        for seq, n in zip(out.seqs, out.num_new_tokens):
            c = seq.num_computed_tokens
            table = seq.block_table
            input_ids.extend(seq.new_token_ids(n))
            positions.extend(range(c, c + n))
            slots.extend(table[p // B] * B + p % B for p in range(c, c + n))
            query_start.append(query_start[-1] + n)
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
                torch.tensor(positions, dtype=torch.long, device=dev), meta)

    @torch.inference_mode()
    def forward(self, out: SchedulerOutput) -> torch.Tensor:
        """One forward over the batch: the final (normed) hidden state of every new token."""
        self.copy_blocks(out.block_copies)
        input_ids, positions, meta = self.prepare(out)
        return self.model(input_ids, positions, self.kv_caches, meta)

    @torch.inference_mode()
    def logits(self, out: SchedulerOutput, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits (on the CPU) of out.logit_rows()."""
        rows = out.logit_rows()
        if not rows:
            return torch.empty(0, self.vocab_size)
        rows_t = torch.tensor(rows, dtype=torch.long, device=self.device)
        return self.model.compute_logits(hidden[rows_t]).float().cpu()

    def run_model(self, out: SchedulerOutput) -> torch.Tensor:
        return self.logits(out, self.forward(out))

    pools_embeddings = True  # fills RunnerOutput.pooled (engine/runner.py)

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        hidden = self._timed("forward", self.forward, out)
        result = self.sampler(out, self._timed("head", self.logits, out, hidden))
        # float64 sums, so a prompt's chunks add up as one sum would
        result.pooled = {seq.seq_id: hidden[start:start + n].double().sum(0).cpu().tolist()
                         for seq, start, n in out.embedding_rows()}
        return result

    def _timed(self, phase: str, fn, *args):
        """fn(*args), its seconds reported to phase_timer when a bench set one."""
        if self.phase_timer is None:
            return fn(*args)
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.phase_timer(phase, time.perf_counter() - t0)
