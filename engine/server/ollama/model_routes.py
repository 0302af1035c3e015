"""Ollama's model routes: /api/version, /api/tags, /api/show, /api/ps and /api/pull. What they say
of a model is models.py's; a pull is the app's downloads (pull.py). Errors are
Ollama's shape, as on its chat routes (routes.py)."""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from engine.service.served_model import LoadedModel, ModelSpec
from engine.server.errors import APIError
from engine.server.model_store import ModelStore
from engine.server.ollama.models import facts as model_facts, listing as model_listing, show as model_show
from engine.server.ollama.protocol import PullRequest, ShowRequest
from engine.server.ollama.pull import pull_reply
from engine.server.ollama.routes import OllamaRoute, ollama_error, ollama_model_id, ollama_not_found


def build_ollama_models_router() -> APIRouter:
    router = APIRouter(route_class=OllamaRoute)

    @router.get("/api/version")
    async def version():
        return {"version": _ember_version()}

    @router.get("/api/tags")
    async def tags(request: Request):
        return {"models": await _listings(request.app.state)}

    @router.post("/api/show")
    async def show(body: ShowRequest, request: Request):
        state = request.app.state
        name = body.model or body.name
        if not name:
            raise APIError(400, "model is required")
        loaded = state.engine_thread.model
        spec = _find(state.model_store, loaded, name)
        try:
            return await run_in_threadpool(model_show, state.model_store, spec, loaded)
        except (OSError, ValueError) as e:
            raise APIError(400, f"cannot read {name!r}: {e}") from None

    @router.post("/api/pull")
    async def pull(body: PullRequest, request: Request):
        name = body.model or body.name
        if not name:
            raise APIError(400, "model is required")
        return await pull_reply(request.app.state.puller, name, body.stream, ollama_error)

    @router.get("/api/ps")
    async def ps(request: Request):
        return {"models": await _running(request.app.state)}

    return router


def _ember_version() -> str:
    from importlib.metadata import PackageNotFoundError, version as dist_version
    try:
        return dist_version("ember")
    except PackageNotFoundError:
        return "0.0.0"


async def _listings(state) -> list[dict]:
    """/api/tags: the loaded model first, then the store's, each once; a file gone or damaged
    since it was installed is left out."""
    loaded = state.engine_thread.model
    specs, seen = ([loaded.spec] if loaded else []) + state.model_store.list(), set()
    models = []
    for spec in specs:
        if spec.id in seen:
            continue
        seen.add(spec.id)
        try:
            models.append(model_listing(spec, await run_in_threadpool(model_facts, state.model_store, spec)))
        except (OSError, ValueError):
            continue
    return models


def _find(store: ModelStore, loaded: LoadedModel | None, name: str) -> ModelSpec:
    """The model /api/show asks for: the loaded one by any of its names, else the store's."""
    mid = ollama_model_id(name)
    if loaded is not None and mid in (loaded.spec.id, loaded.spec.name, Path(loaded.spec.path).name):
        return loaded.spec
    if not store.exists(mid):
        raise ollama_not_found(name)
    try:
        return store.get(mid)
    except (OSError, ValueError) as e:
        raise APIError(400, f"the manifest of {mid!r} is unusable: {e}") from None


async def _running(state) -> list[dict]:
    """/api/ps: the loaded model, with how much of it is on the GPU and its context."""
    loaded = state.engine_thread.model
    if loaded is None:
        return []
    entry = model_listing(loaded.spec, await run_in_threadpool(model_facts, state.model_store, loaded.spec))
    on_gpu = not str(loaded.device).startswith("cpu")
    return [entry | {"size_vram": entry["size"] if on_gpu else 0, "context_length": loaded.engine.max_model_len}]
