"""One frozen configuration for the engine; values derived from it live in the runtime objects.

A field's `help` metadata is its description for `python -m engine serve --help`, whose engine
flags are generated from these fields (engine/serve.py): one declaration, one default.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.model_files.memory import DEFAULT_BLOCK_SIZE, DEFAULT_KV_FRACTION, KV_CACHE_MAX_BYTES


WEIGHTS = ("auto", "quantized", "dense")  # EngineConfig.weights
# EngineConfig.kv_cache_dtype; q8_0 is llama.cpp's 8-bit cache type (engine/kernels/csrc/kv_quant.cpp)
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "q8_0")
DEFAULT_KV_DISK_GIB = 4.0  # EngineConfig.kv_disk_budget_gib and the setting's default


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model_path: str
    dtype: str = "auto"  # "auto" | "float32" | "bfloat16" | "float16": dense weights and KV
    weights: str = field(default="auto", metadata={
        "help": "auto | quantized | dense: keep a GGUF's 4/8-bit weights as they are (Ember's CPU "
                "kernels; auto when they are built and the device is a CPU) or dequantize them"})
    kv_cache_dtype: str = field(default="auto", metadata={
        "help": "auto | float32 | bfloat16 | float16 | q8_0: the KV cache's type (auto: the dtype; q8_0: "
                "8 bits and a scale per 32 values, half of bf16, on Ember's CPU kernels or llama.cpp)"})
    device: str = "cpu"  # "cpu" | "cuda" | "mps"
    block_size: int = DEFAULT_BLOCK_SIZE  # tokens per KV block; 16 suits CPUs (vLLM's default too)
    max_num_seqs: int = field(default=64, metadata={"help": "sequences batched in one step"})
    max_num_batched_tokens: int = 1024  # token budget of one step (decodes + prefill chunks)
    max_prefill_chunk: int = 256  # a prompt is prefilled in chunks of at most this many tokens
    max_model_len: int | None = field(default=None, metadata={
        "help": "context length (default: the model's own, capped at 4096)"})
    kv_memory_fraction: float = field(default=DEFAULT_KV_FRACTION, metadata={
        "help": "share of the memory free after the weights are loaded that the KV cache takes"})
    kv_cache_max_bytes: int = KV_CACHE_MAX_BYTES  # cap on the KV pool (reserved; memory is committed as chats write it)
    kv_idle_cache_tokens: int | None = field(default=None, metadata={
        "help": "KV that finished chats keep for their next turn (prefix cache), in tokens; the rest "
                "goes back to the system (default: one context, max_model_len)"})
    num_kv_blocks: int | None = field(default=None, metadata={
        "help": "fixed KV pool size in blocks (tests, benchmarks); overrides the memory share and the byte cap"})
    enable_prefix_caching: bool = True
    kv_disk_dir: str | None = field(default=None, metadata={
        "help": "a folder where full KV blocks are kept across restarts (the prefix cache's disk tier; "
                "default: none, RAM only)"})
    kv_disk_budget_gib: float = field(default=DEFAULT_KV_DISK_GIB, metadata={
        "help": "the disk tier's budget in GiB, all models together (never more than a quarter of the free "
                "space); the least recently used blocks go first"})
    exact_greedy: bool = field(default=True, metadata={
        "help": "greedy replies independent of the other chats on the llama.cpp runner too (a CPU with flash "
                "attention: steps with a greedy chat decode in parts of 2-63 rows; their prefill is slower)"})
    speculative: str = field(default="off", metadata={
        "help": "off | ngram | draft:PATH: speculative decoding with prompt lookup or a draft model of "
                "the same vocabulary (drafts per step chosen from measured costs; exact)"})
    num_speculative_tokens: int | None = field(default=None, metadata={
        "help": "drafts per step (default: chosen each step by measured goodput, up to 8; 0 keeps the "
                "drafter's shadow statistics only)"})
    chat_template: str | None = None  # a Jinja template file used in place of the model's own (--chat-template)
    mmproj: str | None = None  # a vision model's projector GGUF (--mmproj): chats may carry images (llama.cpp)
    num_threads: int | None = field(default=None, metadata={
        "help": "CPU threads of the kernels (default: torch's own; all cores for llama.cpp)"})
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, not {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, not {self.kv_cache_dtype!r}")
        if self.weights not in WEIGHTS:
            raise ValueError(f"weights must be auto, quantized or dense, not {self.weights!r}")
        if self.block_size < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be positive")
        if self.speculative not in ("off", "ngram") and not (self.speculative.startswith("draft:")
                                                             and len(self.speculative) > 6):
            raise ValueError(f"speculative must be off, ngram or draft:PATH, not {self.speculative!r}")
        if self.num_speculative_tokens is not None and not 0 <= self.num_speculative_tokens <= 16:
            raise ValueError("num_speculative_tokens must be between 0 and 16")
        if self.max_prefill_chunk < 1:
            raise ValueError("max_prefill_chunk must be positive")
        if self.kv_idle_cache_tokens is not None and self.kv_idle_cache_tokens < 0:
            raise ValueError("kv_idle_cache_tokens must be >= 0")
        if self.kv_disk_budget_gib < 0:
            raise ValueError("kv_disk_budget_gib must be >= 0")
        if not 0.0 < self.kv_memory_fraction <= 1.0:
            raise ValueError("kv_memory_fraction must be in (0, 1]")
