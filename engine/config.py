"""One frozen configuration for the engine; values derived from it live in the runtime objects.

A field's `help` metadata is its description for `python -m engine serve --help`, whose engine
flags are generated from these fields (engine/server/cli.py): one declaration, one default.
"""
from __future__ import annotations

from dataclasses import dataclass, field


WEIGHTS = ("auto", "quantized", "dense")  # EngineConfig.weights


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model_path: str
    dtype: str = "auto"  # "auto" | "float32" | "bfloat16" | "float16": dense weights and KV
    weights: str = field(default="auto", metadata={
        "help": "auto | quantized | dense: keep a GGUF's 4/8-bit weights as they are (Ember's CPU "
                "kernels; auto when they are built and the device is a CPU) or dequantize them"})
    device: str = "cpu"  # "cpu" | "cuda" | "mps"
    block_size: int = 16  # tokens per KV block; 16 suits CPUs (vLLM's default too)
    max_num_seqs: int = field(default=64, metadata={"help": "sequences batched in one step"})
    max_num_batched_tokens: int = 1024  # token budget of one step (decodes + prefill chunks)
    max_prefill_chunk: int = 256  # a prompt is prefilled in chunks of at most this many tokens
    max_model_len: int | None = field(default=None, metadata={
        "help": "context length (default: the model's own, capped at 4096)"})
    kv_memory_fraction: float = field(default=0.25, metadata={
        "help": "share of the memory free after the weights are loaded that the KV cache takes"})
    kv_cache_max_bytes: int = 1 << 30  # cap on the KV pool (zeroed up front: keep it modest)
    num_kv_blocks: int | None = field(default=None, metadata={
        "help": "fixed KV pool size in blocks (tests, benchmarks); overrides the memory share and the byte cap"})
    enable_prefix_caching: bool = True
    num_threads: int | None = field(default=None, metadata={
        "help": "CPU threads of the kernels (default: torch's own; all cores for llama.cpp)"})
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, not {self.dtype!r}")
        if self.weights not in WEIGHTS:
            raise ValueError(f"weights must be auto, quantized or dense, not {self.weights!r}")
        if self.block_size < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be positive")
        if self.max_prefill_chunk < 1:
            raise ValueError("max_prefill_chunk must be positive")
        if not 0.0 < self.kv_memory_fraction <= 1.0:
            raise ValueError("kv_memory_fraction must be in (0, 1]")
