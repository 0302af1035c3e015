"""The commands HTTP handlers post to the engine thread (engine_thread.py), one dataclass each,
matched by the thread's loop; a request's results go back through its `Sink`.
"""
from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class Load:
    spec: ModelSpec
    future: concurrent.futures.Future


@dataclass(frozen=True, slots=True)
class Unload:
    future: concurrent.futures.Future


@dataclass(frozen=True, slots=True)
class Stop:
    """End the loop: the server is shutting down."""


Command = Add | Abort | Load | Unload | Stop
