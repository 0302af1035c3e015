"""The model a request names, resident for as long as the request runs.

Every API names its model (OpenAI's and Anthropic's `model`, Ollama's `name:tag`); `use_model`
finds it (an Ember id, its display name, its file's name, or Ollama's `id:tag`), asks the engine
thread for it (loaded just in time beside the others, after waiting for memory if it must) and
*holds* it until the request's response has been sent, stream included: `HoldsMiddleware`
releases the holds when the ASGI call returns, so a model is never unloaded under a reply.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import math
from pathlib import Path

from starlette.requests import Request

from engine.model_files.errors import ModelFileError
from engine.server.errors import APIError
from engine.server.model_store import ModelNotFound, ModelStore
from engine.service.handle import KEEP_DEFAULT, EngineHandle
from engine.service.model_set import DoesNotFit, QueueFull
from engine.service.served_model import LoadedModel, ModelSpec

HOLDS = "ember.holds"  # the scope key of a request's held model ids
DEFAULT_NAMES = ("", "default")


class HoldsMiddleware:
    """Pure ASGI, outermost but one: every model a request acquired is released when its
    response (a stream too) has ended, however it ended."""

    def __init__(self, app, thread: EngineHandle) -> None:
        self.app, self.thread = app, thread

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        holds: list[str] = []
        scope[HOLDS] = holds
        try:
            await self.app(scope, receive, send)
        finally:
            for model_id in holds:
                self.thread.release(model_id)


def names_of(spec: ModelSpec) -> tuple[str, ...]:
    return tuple(n for n in (spec.id, spec.name, Path(spec.path).name) if n)


def resolve(thread: EngineHandle, store: ModelStore, default: ModelSpec | None, requested: str | None,
            text: bool = False) -> ModelSpec:
    """The spec a request's model name means: a loaded (or loading) model by any of its names,
    else an installed one by id; `id:latest` (Ollama's tag) is the id. No name: the model used
    most recently (with `text`, the most recent that makes text: documents load an embedding model
    beside the chat model, and a chat that names none must not land on it), else the server's default."""
    name = (requested or "").strip()
    if name.lower() in DEFAULT_NAMES:
        newest = thread.model
        if text:
            newest = next((m.model for m in thread.models if m.model is not None and m.model.generates), None)
        if newest is not None:
            return newest.spec
        if default is not None:
            return default
        raise APIError(503, f"no model is loaded ({thread.message}); name one in the request",
                       code="model_not_loaded")
    candidates = (name, name.removesuffix(":latest"))
    known = [m.spec for m in thread.models] + ([default] if default is not None else [])
    for spec in known:
        if any(n in names_of(spec) for n in candidates):
            return spec
    for n in candidates:
        if store.exists(n):
            try:
                return store.get(n)
            except ModelNotFound:
                break
            except (OSError, ValueError) as e:
                raise APIError(400, f"the manifest of {n!r} is unusable: {e}", code="invalid_manifest") from None
    raise APIError(404, f"the model {requested!r} does not exist", code="model_not_found", param="model")


async def use_model(request: Request, requested: str | None, text: bool = True,
                    keep_alive_s: float | None | object = KEEP_DEFAULT) -> LoadedModel:
    """The named model, resident and held for this request; with `text`, one that generates (an
    embedding model answers only the embedding routes)."""
    state = request.app.state
    thread: EngineHandle = state.engine_thread
    spec = resolve(thread, state.model_store, state.settings.default_model, requested, text)
    loaded = await acquire(thread, spec, keep_alive_s)
    request.scope[HOLDS].append(spec.id)
    if text and not loaded.generates:
        raise APIError(400, f"{spec.id!r} is an embedding model: it makes embeddings (/v1/embeddings, "
                       "/v1/rerank, /api/embed), not text; choose a chat model to chat",
                       code="invalid_model", param="model")
    return loaded


async def acquire(thread: EngineHandle, spec: ModelSpec, keep_alive_s) -> LoadedModel:
    fut = thread.acquire(spec, keep_alive_s)
    wait = thread.residency.max_wait_s
    try:
        return await asyncio.wait_for(asyncio.wrap_future(fut), wait)
    except (asyncio.TimeoutError, asyncio.CancelledError) as e:
        _let_go(thread, fut, spec.id)
        if isinstance(e, asyncio.CancelledError):
            raise
        raise APIError(503, f"{spec.id} waited {wait:.0f}s for memory held by running replies; try again",
                       code="model_waiting", headers={"Retry-After": str(math.ceil(min(wait, 60)))}) from None
    except QueueFull as e:
        raise APIError(503, str(e), code="queue_full", headers={"Retry-After": "10"}) from None
    except (DoesNotFit, ModelFileError, OSError, ValueError, RuntimeError, MemoryError) as e:
        raise APIError(400, f"loading {spec.id} failed: {e}", code="model_load_failed", param="model") from None


def release_early(request: Request, model_id: str) -> None:
    """The request stops holding `model_id` before its response ends: background work (a warm)
    must not keep a model loaded that a request for another model needs the room of."""
    holds = request.scope[HOLDS]
    if model_id in holds:
        holds.remove(model_id)
        request.app.state.engine_thread.release(model_id)


def _let_go(thread: EngineHandle, fut: concurrent.futures.Future, model_id: str) -> None:
    """A request that stops waiting: its place in the queue is given up, or the model it got
    after all is released."""
    if fut.cancel():
        return
    fut.add_done_callback(lambda f: f.cancelled() or f.exception() or thread.release(model_id))
