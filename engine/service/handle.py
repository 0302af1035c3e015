"""What the HTTP side sees of the engine thread: its status (one immutable snapshot), the error a
request gets when no model serves it, and `EngineHandle`, the calls a handler may make.

The thread itself (engine_thread.py) is built by whoever runs the process (engine/serve.py, or a
test) and handed to the app, so engine/server/ never owns it.
"""
from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from engine.service.served_model import LoadedModel, ModelSpec

if TYPE_CHECKING:
    from engine.llm_engine import EngineStats, LLMEngine
    from engine.sampling_params import SamplingParams
    from engine.service.allocator import Trimmer
    from engine.service.engine_commands import Sink
    from engine.service.metrics import Metrics
    from engine.service.residency import ResidencyConfig


class EngineUnavailable(RuntimeError):
    """No model is loaded (or it is loading, or the load failed)."""


KEEP_DEFAULT = object()  # acquire's keep-alive when the request names none: the server's setting


class EngineState(StrEnum):
    """What /health says, like llama.cpp's server_state (the values are the HTTP API's)."""
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """One resident (or loading) model, as /v1/engine/status and /api/ps list it."""
    spec: ModelSpec
    state: str  # "ready" | "loading"
    model: LoadedModel | None = None
    bytes: int = 0  # what the memory budget counts for it
    running: int = 0  # its requests in the engine
    expires_at: float | None = None  # time.time() it unloads at if still idle (None: it stays)
    stats: EngineStats | None = None


@dataclass(frozen=True, slots=True)
class QueuedLoad:
    """A model that requests wait for memory to load, `position` 1 first in line."""
    model: str
    position: int
    waiting_s: float
    requests: int


@dataclass(frozen=True, slots=True)
class MemoryStatus:
    budget_bytes: int
    used_bytes: int  # the budget's count of what is resident and loading
    max_models: int


@dataclass(frozen=True, slots=True)
class EngineStatus:
    """The engine thread's state, replaced whole so that a reader never sees half a change.
    `model` is the most recently used resident model (what /health's one-model fields say);
    `models` every resident and loading one, most recently used first."""
    state: EngineState
    message: str
    loading: ModelSpec | None = None  # a model being loaded
    model: LoadedModel | None = None  # set only when READY
    models: tuple[ModelStatus, ...] = ()
    queue: tuple[QueuedLoad, ...] = ()
    memory: MemoryStatus | None = None


class EngineHandle(Protocol):
    """The engine thread as handlers use it: read its status, post work, and start or stop it with
    the app. Every call is safe from any thread; only the thread's loop touches the engine."""
    metrics: Metrics
    trimmer: Trimmer
    residency: ResidencyConfig
    stats: EngineStats | None  # the loop's last snapshot (None: no model)

    @property
    def status(self) -> EngineStatus: ...
    @property
    def state(self) -> EngineState: ...
    @property
    def message(self) -> str: ...
    @property
    def loading(self) -> ModelSpec | None: ...
    @property
    def model(self) -> LoadedModel | None: ...
    @property
    def num_requests(self) -> int: ...

    @property
    def models(self) -> tuple[ModelStatus, ...]: ...

    def start(self) -> None: ...
    def stop(self, timeout: float = 10.0) -> None: ...
    def submit_sink(self, prompt_ids: list[int], params: SamplingParams, request_id: str,
                    engine: LLMEngine, sink: Sink, images: list | None = None) -> None: ...
    def abort(self, request_id: str) -> None: ...
    def acquire(self, spec: ModelSpec, keep_alive_s: float | None | object = KEEP_DEFAULT) -> concurrent.futures.Future: ...
    def release(self, model_id: str) -> None: ...
    def load(self, spec: ModelSpec, keep_alive_s: float | None = None) -> concurrent.futures.Future: ...
    def unload(self, model_id: str | None = None) -> concurrent.futures.Future: ...
