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


class EngineUnavailable(RuntimeError):
    """No model is loaded (or it is loading, or the load failed)."""


class EngineState(StrEnum):
    """What /health says, like llama.cpp's server_state (the values are the HTTP API's)."""
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class EngineStatus:
    """The engine thread's state, replaced whole so that a reader never sees half a change."""
    state: EngineState
    message: str
    loading: ModelSpec | None = None  # the model being loaded
    model: LoadedModel | None = None  # the model in service (set only when READY)


class EngineHandle(Protocol):
    """The engine thread as handlers use it: read its status, post work, and start or stop it with
    the app. Every call is safe from any thread; only the thread's loop touches the engine."""
    metrics: Metrics
    trimmer: Trimmer
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

    def start(self) -> None: ...
    def stop(self, timeout: float = 10.0) -> None: ...
    def submit_sink(self, prompt_ids: list[int], params: SamplingParams, request_id: str,
                    engine: LLMEngine, sink: Sink) -> None: ...
    def abort(self, request_id: str) -> None: ...
    def load(self, spec: ModelSpec) -> concurrent.futures.Future: ...
    def unload(self) -> concurrent.futures.Future: ...
