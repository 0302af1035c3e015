"""From a ModelSpec to a running LLMEngine: backend and device choice, then the runner.

The decision itself (what the machine has, what the model needs) lives in engine/backends
(`decide` → `config_for` → `create_runner`); this is the engine thread's factory around it,
and it runs on the engine thread. A model that does not fit raises BackendError with a
message that says what would; /health then shows it.
"""
from __future__ import annotations

import logging
from pathlib import Path

from engine.config import EngineConfig
from engine.model_files.fit import UnsupportedArchitecture, footprint_of, unsupported_architecture
from engine.model_files.footprint import default_context
from engine.model_files.memory import DEFAULT_BLOCK_SIZE
from engine.model_files.meta import read_meta
from engine.model_files.projector import check_projector
from engine.service.residency import ResidencyConfig
from engine.service.served_model import EngineFactory, LoadedModel, ModelSpec

log = logging.getLogger(__name__)


def make_engine_factory(backend: str = "auto", device: str = "auto", **config_kw) -> EngineFactory:
    """`config_kw` are EngineConfig fields (dtype, max_model_len, num_kv_blocks, num_threads, ...)."""

    def factory(spec: ModelSpec, kv_cache_max_bytes: int | None = None) -> LoadedModel:
        """`kv_cache_max_bytes`: the model's share of the memory budget for its KV pool."""
        from engine.backends import load_engine

        kw = {k: v for k, v in config_kw.items() if v is not None}
        if kv_cache_max_bytes:
            kw["kv_cache_max_bytes"] = min(kv_cache_max_bytes, kw.get("kv_cache_max_bytes", kv_cache_max_bytes))
        if spec.chat_template and "chat_template" not in kw:  # --chat-template, when given, wins
            kw["chat_template"] = spec.chat_template
        if spec.mmproj and "mmproj" not in kw:  # likewise --mmproj
            kw["mmproj"] = spec.mmproj
        load = spec.load  # the model's own load settings win over the server's
        kw |= {k: v for k, v in (("max_model_len", load.context_length), ("num_threads", load.threads)) if v}
        config = EngineConfig(model_path=spec.path, **kw)
        engine, decision = load_engine(config, backend, load.device or device)
        return LoadedModel(spec, engine, decision.backend, decision.device, decision.as_dict())

    return factory


def estimate_bytes(spec: ModelSpec, residency: ResidencyConfig, num_kv_blocks: int | None = None,
                   max_model_len: int | None = None, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """What the budget counts for a model before it loads (the runner's own figures replace it once
    loaded): its weights (the file, and a vision model's projector) and its KV pool, counted as
    float32 so as never to fall short: a fixed pool's blocks, else its share of the budget but at
    least one full context (the pool's floor, memory.py)."""
    p = Path(spec.path)
    try:
        weights = p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.glob("*.safetensors"))
        fp = footprint_of(read_meta(p), weights)
        weights += Path(spec.mmproj).stat().st_size if spec.mmproj else 0
    except (OSError, ValueError):
        return 0  # the load itself says what is wrong with the path
    per_token = fp.kv_bytes_per_token(4)
    if num_kv_blocks:
        return weights + num_kv_blocks * block_size * per_token
    context = default_context(fp.context_length or 4096, spec.load.context_length or max_model_len)
    return weights + max(residency.kv_cap_bytes(weights), context * per_token)


def fits_now(nbytes: int) -> bool:
    """Whether the machine has `nbytes` free at this moment (MemAvailable), with a margin: then a
    new model loads before the idle ones it replaces are unloaded, so a failed load costs nothing."""
    import psutil

    return psutil.virtual_memory().available > nbytes * 1.25


def check_model_file(spec: ModelSpec) -> None:
    """What the store's import checks, in milliseconds: a truncated or corrupt file, or one no runner
    runs, raises ModelFileError before a load unloads the model that serves now."""
    if why := unsupported_architecture(footprint_of(read_meta(Path(spec.path)), 0)):
        raise UnsupportedArchitecture(why)  # in the words a failed load gives it (the model is named)
    if spec.mmproj:
        check_projector(spec.mmproj, spec.path)
