"""The model a server serves: `ModelSpec`, what the store says to load, and `LoadedModel`, what
loading it gave (the engine and the backend decision). The store, the loaders and the routes
use them without the engine thread that holds one.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.model_files.load_settings import LoadSettings

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model from the store: what to load and the name clients call it by."""
    id: str
    path: str
    format: str = "gguf"
    name: str | None = None
    context_length: int | None = None
    chat_template: str | None = None  # a template file the user set for this installed model
    mmproj: str | None = None  # a vision model's projector GGUF, loaded beside it
    load: LoadSettings = LoadSettings()  # the user's context, device and threads for this model


@dataclass(slots=True)
class LoadedModel:
    """What an engine factory returns: the engine plus the backend decision (shown on /health)."""
    spec: ModelSpec
    engine: LLMEngine
    backend: str
    device: str
    decision: dict = field(default_factory=dict)

    @property
    def memory_bytes(self) -> int:
        """What the memory budget counts for it: the runner's weights and KV reservation, and its
        draft model's (speculative decoding), from their own figures."""
        s, spec = self.engine.stats(), self.engine.speculator
        return (s.weight_bytes or 0) + (s.kv_bytes or 0) + (spec.drafter.memory_bytes if spec is not None else 0)

    @property
    def generates(self) -> bool:
        """False for an embedding model: it makes embeddings, not text (EmbeddingRunner)."""
        return self.engine.runner.generates


EngineFactory = Callable[..., LoadedModel]  # (spec, kv_cache_max_bytes=None): loading.make_engine_factory
