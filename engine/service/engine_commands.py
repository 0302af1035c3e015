"""The commands HTTP handlers post to the engine thread (engine_thread.py), one dataclass each,
matched by the thread's loop; a request's results go back through its `Sink`.
"""
from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.sampling_params import SamplingParams
from engine.service.served_model import ModelSpec

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine

Sink = Callable[[Any], None]  # receives a RequestOutput, or an exception that ends the request


@dataclass(frozen=True, slots=True)
class Add:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    engine: LLMEngine  # the one the prompt was tokenized for
    sink: Sink
    images: list = field(default_factory=list)  # the prompt's image spans (a vision model)


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class Acquire:
    """A request wants `spec` resident: the future resolves to its LoadedModel, held until a
    Release (loaded just in time, after waiting for memory if it must)."""
    spec: ModelSpec
    keep_alive_s: float | None  # how long it stays once idle (None: until unloaded or memory is short)
    future: concurrent.futures.Future


@dataclass(frozen=True, slots=True)
class Release:
    model_id: str


@dataclass(frozen=True, slots=True)
class Loaded:
    """The loader finished `spec`: the model, or the exception its load raised."""
    spec: ModelSpec
    result: Any


@dataclass(frozen=True, slots=True)
class Unload:
    model_id: str | None  # None: every model
    future: concurrent.futures.Future


@dataclass(frozen=True, slots=True)
class Stop:
    """End the loop: the server is shutting down."""


Command = Add | Abort | Acquire | Release | Loaded | Unload | Stop
