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
from engine.model_files.meta import read_meta
from engine.service.served_model import EngineFactory, LoadedModel, ModelSpec

log = logging.getLogger(__name__)


def make_engine_factory(backend: str = "auto", device: str = "auto", **config_kw) -> EngineFactory:
    """`config_kw` are EngineConfig fields (dtype, max_model_len, num_kv_blocks, num_threads, ...)."""

    def factory(spec: ModelSpec) -> LoadedModel:
        from engine.backends import load_engine

        kw = {k: v for k, v in config_kw.items() if v is not None}
        if spec.chat_template and "chat_template" not in kw:  # --chat-template, when given, wins
            kw["chat_template"] = spec.chat_template
        load = spec.load  # the model's own load settings win over the server's
        kw |= {k: v for k, v in (("max_model_len", load.context_length), ("num_threads", load.threads)) if v}
        config = EngineConfig(model_path=spec.path, **kw)
        engine, decision = load_engine(config, backend, load.device or device)
        return LoadedModel(spec, engine, decision.backend, decision.device, decision.as_dict())

    return factory


def check_model_file(spec: ModelSpec) -> None:
    """What the store's import checks, in milliseconds: a truncated or corrupt file, or one no runner
    runs, raises ModelFileError before a load unloads the model that serves now."""
    if why := unsupported_architecture(footprint_of(read_meta(Path(spec.path)), 0)):
        raise UnsupportedArchitecture(why)  # in the words a failed load gives it (the model is named)
