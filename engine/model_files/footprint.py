"""A model's memory shape and the bytes it needs at a context: the estimate behind the fit rule
(engine/model_files/fit.py) and the engine's memory (engine/model_files/memory.py). No torch.

Memory a loaded model needs (one sequence at the context the engine loads with):
    weights + KV per token × context + RUNTIME_OVERHEAD_BYTES  ≤  USABLE_FRACTION × free memory
    KV per token = 2 (K and V) × layers × KV heads × head_dim × bytes per element
(GQA stores only the KV heads.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from engine.model_files.architectures import EMBER_ARCHITECTURES, embeds_only, llama_cpp_runs
from engine.model_files.families import NOT_YET

GiB = 1 << 30
MiB = 1 << 20
# Room for activations, the logits buffer, the allocator and the rest of the process.
RUNTIME_OVERHEAD_BYTES = 512 * MiB
# Use at most this fraction of the memory that is free now; the desktop keeps running beside us.
USABLE_FRACTION = 0.9
# The context a model loads with unless one is asked for: its own, capped (KV grows with it).
MAX_DEFAULT_CONTEXT = 4096
CONTEXT_STEP = 256  # suggested contexts are multiples of this


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, itemsize: float = 2,
                       value_head_dim: int = 0) -> int:
    """K and V, every layer, only the KV heads: L · n_kv · (hd_k + hd_v) · itemsize (2: f16,
    llama.cpp's KV); hd_v = hd_k unless the model says otherwise."""
    return int(num_layers * num_kv_heads * (head_dim + (value_head_dim or head_dim)) * itemsize)


# The GGUF types Ember's kernels hold quantized (engine/loaders/gguf_blocks.py's REPACKABLE, named
# here torch-free for the GUI's estimates; tests/app/test_fit_agreement.py checks they agree)
KERNEL_TYPES = frozenset({"Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0"})


def kernel_matrix(name: str, ndim: int) -> bool:
    """A GGUF tensor Ember's kernels would hold quantized: a matrix, or a stack of experts'
    matrices, but not a mixture's router (ffn_gate_inp), held in float32 whatever its type (its
    top-k is a choice that int8 activations would move; llama.cpp's quantizer leaves it F32)."""
    return ndim >= 2 and not name.endswith("ffn_gate_inp.weight")


@dataclass(frozen=True, slots=True)
class ModelFootprint:
    """The model's memory shape: weight bytes and KV bytes per token of context."""
    format: str  # one of FORMATS
    weights_bytes: int
    num_layers: int  # 0 when not known (the KV term is then left out)
    num_kv_heads: int
    head_dim: int
    context_length: int  # the model's trained context
    kernels_cover: bool = False  # every matrix of a type Ember's kernels hold quantized (GPTQ/AWQ: 4 and 8 bits)
    architecture: str = ""  # general.architecture / model_type ("": not known, not checked)
    value_head_dim: int = 0  # 0: the keys' head_dim
    # Windowed layers and their window, from the header. On Ember's engine the KV estimate
    # counts them at their window (kv_bytes); the llama.cpp runner keeps the full cache
    # (swa_full), since its prompt cache and rollbacks need positions that fell out of it.
    sliding_window: int = 0
    sliding_layers: int = 0
    # Ember's own (torch) engine runs it: the Llama/Qwen2 family as its loader accepts them, and
    # every GPTQ/AWQ checkpoint accepted (their reader refuses other model types)
    ember_engine: bool = True
    ember_engine_why_not: str = ""  # the loader's refusal, logged when auto picks llama.cpp for it
    # A mixture of experts: the weight bytes one token reads (the file is held whole; weights_bytes
    # is what must fit, this what a decode step streams); 0: every weight, a dense model.
    active_bytes: int = 0

    def kv_bytes_per_token(self, kv_dtype_bytes: float) -> int:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, kv_dtype_bytes,
                                  self.value_head_dim)

    @property
    def embeds_only(self) -> bool:
        """An embedding model (an encoder): it makes embeddings, not text (architectures.py)."""
        return embeds_only(self.architecture)

    @property
    def llama_cpp_runs(self) -> bool:
        return self.format == "gguf" and (not self.architecture or llama_cpp_runs(self.architecture))


def footprint_of(meta, weights_bytes: int) -> ModelFootprint:
    """The footprint of anything that carries the KV shape: a ModelMeta, a ModelManifest, a
    CatalogEntry or a dict with num_layers, num_kv_heads, head_dim, context_length (and format)."""
    def get(name):
        return meta.get(name) if isinstance(meta, dict) else getattr(meta, name, None)

    fmt, arch = get("format") or "gguf", get("architecture") or ""
    return ModelFootprint(fmt, int(weights_bytes), get("num_layers") or 0,
                          get("num_kv_heads") or 0, get("head_dim") or 0,
                          get("context_length") or MAX_DEFAULT_CONTEXT,
                          architecture=arch, ember_engine=fmt != "gguf" or not arch or arch in EMBER_ARCHITECTURES,
                          value_head_dim=get("value_head_dim") or 0, kernels_cover=bool(get("kernels_cover")),
                          sliding_window=get("sliding_window") or 0, sliding_layers=get("sliding_layers") or 0,
                          active_bytes=get("active_bytes") or 0,
                          ember_engine_why_not=NOT_YET.get(arch, "") or (
                              "an embedding model: llama.cpp embeds it" if embeds_only(arch) else ""))


def default_context(model_context: int, requested: int | None = None) -> int:
    """The context a model loads with: the one asked for, else its own capped at MAX_DEFAULT_CONTEXT;
    never past its own."""
    return min(requested or min(model_context, MAX_DEFAULT_CONTEXT), model_context)


def kv_itemsize(backend: str, dtype: str, kv_cache_dtype: str = "auto") -> float:
    """Bytes per KV element: llama.cpp keeps its KV cache in f16, torch in the engine's dtype,
    unless the cache's own type is set; q8_0 is a byte and a float16 scale per 32 values."""
    if kv_cache_dtype == "q8_0":
        return 17 / 16
    if kv_cache_dtype == "auto":
        kv_cache_dtype = "float16" if backend == "llama.cpp" else dtype
    return 4 if kv_cache_dtype == "float32" else 2


def kv_room(fp: ModelFootprint, available: int) -> int:
    """Bytes left for the KV cache: the usable share of `available` less weights and overhead."""
    return int(available * USABLE_FRACTION) - fp.weights_bytes - RUNTIME_OVERHEAD_BYTES


# Tokens a sliding-window layer of Ember's engine holds beyond its window: the blocks of 16 at
# its edge (engine/kv_window.py keeps the window of the last block boundary, plus the block
# being written).
WINDOW_EDGE_TOKENS = 32


def kv_bytes(fp: ModelFootprint, backend: str, tokens: int, dtype: str) -> int:
    """KV one sequence of `tokens` holds: K and V of every layer per token, except that on
    Ember's engine a sliding-window layer gives back what falls behind its window, so it holds
    at most window + WINDOW_EDGE_TOKENS; llama.cpp's runner keeps the full cache (swa_full)."""
    per_token = fp.kv_bytes_per_token(kv_itemsize(backend, dtype))
    if backend != "torch" or not (fp.sliding_window and fp.sliding_layers and fp.num_layers):
        return per_token * tokens
    per_layer = per_token / fp.num_layers
    held = min(tokens, fp.sliding_window + WINDOW_EDGE_TOKENS)
    return math.ceil(per_layer * ((fp.num_layers - fp.sliding_layers) * tokens + fp.sliding_layers * held))


def estimate_bytes(fp: ModelFootprint, backend: str, context_length: int, dtype: str) -> int:
    """Weights + KV for one sequence at `context_length` + overhead: the least that must fit."""
    return fp.weights_bytes + kv_bytes(fp, backend, context_length, dtype) + RUNTIME_OVERHEAD_BYTES


def max_context_that_fits(fp: ModelFootprint, backend: str, dtype: str, available: int,
                          multiple: int = CONTEXT_STEP) -> int:
    """Longest context (rounded down to `multiple`) whose estimate fits in `available` bytes."""
    room = kv_room(fp, available)
    if room < 0:
        return 0
    lo, hi = 0, fp.context_length  # kv_bytes grows with the tokens: the last that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if kv_bytes(fp, backend, mid, dtype) <= room else (lo, mid - 1)
    return lo // multiple * multiple


def fits(fp: ModelFootprint, backend: str, ctx: int, dtype: str, available: int) -> bool:
    return kv_bytes(fp, backend, ctx, dtype) <= kv_room(fp, available)
