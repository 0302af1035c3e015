"""Opening a GGUF in llama.cpp and sizing its context: the steps LlamaCppRunner is built from.

The KV block is sized by the torch pool's rule (engine/kv_sizing.py), so the engine's block
manager admits against exactly the cells llama.cpp has: cells = blocks * block_size.
"""
from __future__ import annotations

from pathlib import Path

from engine.backends.llamacpp_context import ResizableContext, kv_cache_type
from engine.config import EngineConfig
from engine.kv_sizing import kv_bytes_per_block
from engine.model_files.footprint import kv_itemsize
from engine.model_files.meta import read_gguf_meta


class LlamaCppError(RuntimeError):
    """llama.cpp refused a batch or a model; the message says which and why."""


def llama():
    import llama_cpp  # imported lazily: engine modules that never use this backend need not load it
    return llama_cpp


def load_model(ll, path: Path, n_gpu_layers: int):
    """llama.cpp's model of the file at `path`, its first `n_gpu_layers` layers on the GPU."""
    if not path.is_file():
        raise LlamaCppError(f"model file not found: {path}")
    ll.llama_backend_init()
    mparams = ll.llama_model_default_params()
    mparams.n_gpu_layers = n_gpu_layers
    model = ll.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        raise LlamaCppError(f"llama.cpp could not load {path} (not a GGUF it supports?)")
    return model


def kv_block_bytes(ll, model, path: Path, config: EngineConfig) -> int:
    """Bytes of one KV block of `config.block_size` cells in llama.cpp's f16 KV."""
    n_layer, n_embd, n_head, n_head_kv = (int(f(model)) for f in (
        ll.llama_model_n_layer, ll.llama_model_n_embd, ll.llama_model_n_head, ll.llama_model_n_head_kv))
    meta = read_gguf_meta(path)  # head sizes as the header states them (Gemma 3: 256, not n_embd / n_head)
    itemsize = kv_itemsize("llama.cpp", config.dtype)  # f16, llama.cpp's KV type
    return kv_bytes_per_block(n_layer, config.block_size, n_head_kv, meta.head_dim or n_embd // n_head, itemsize,
                              meta.value_head_dim or 0)


def context_params(ll, config: EngineConfig, n_seq_max: int, n_batch: int, threads: int, *,
                   flash_attn: bool, kv_unified: bool):
    """llama_context_params for `n_seq_max` slots and steps of up to `n_batch` tokens."""
    cparams = ll.llama_context_default_params()
    cparams.n_seq_max = n_seq_max + 2  # and the padding row's and the grave's (llamacpp_context)
    cparams.n_batch = max(n_batch + 1, cparams.n_seq_max)  # a padding row; llama.cpp's minimum
    cparams.n_ubatch = min(n_batch, 512)
    cparams.kv_unified = kv_unified  # one cell pool for all sequences, as the engine's block pool
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.type_k = cparams.type_v = kv_cache_type(config.kv_cache_dtype, flash_attn)
    cparams.flash_attn_type = (ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                               else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    cparams.no_perf = True
    return cparams


def open_context(ll, model, cparams, max_cells: int) -> ResizableContext:
    """The context the runner decodes in, growing up to `max_cells`; the model is freed when it fails."""
    try:
        return ResizableContext(ll, model, cparams, max_cells=max_cells)
    except MemoryError as e:
        ll.llama_model_free(model)
        raise LlamaCppError(str(e)) from None


def decode_error(ret: int, n: int, n_cells: int) -> LlamaCppError:
    """What llama_decode's nonzero return means; on 1 (and -1) llama.cpp restores the memory state
    to what it was before the call."""
    return LlamaCppError({
        1: f"llama.cpp found no KV slot for a batch of {n} tokens ({n_cells} cells); lower "
           "max_num_seqs or max_model_len, or raise the KV memory fraction",
        2: "llama_decode was aborted", -1: "llama_decode rejected the batch as invalid (positions/seq ids)",
    }.get(ret, f"llama_decode failed with code {ret}"))
