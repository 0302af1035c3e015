"""Ollama's model routes: /api/version, /api/tags, /api/show, /api/ps and /api/pull. What they say
of a model is ollama_models.py's; a pull is the app's downloads (ollama_pull.py). Errors are
Ollama's shape, as on its chat routes (ollama_routes.py)."""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from engine.server.errors import APIError
from engine.server.ollama_models import facts as model_facts, listing as model_listing, show as model_show
from engine.server.ollama_protocol import PullRequest, ShowRequest
from engine.server.ollama_pull import pull_reply
from engine.server.ollama_routes import OllamaRoute, ollama_error, ollama_model_id, ollama_not_found


def build_ollama_models_router() -> APIRouter:
    router = APIRouter(route_class=OllamaRoute)

    @router.get("/api/version")
    async def version():
        from importlib.metadata import PackageNotFoundError, version as dist_version
        try:
            return {"version": dist_version("ember")}
        except PackageNotFoundError:
            return {"version": "0.0.0"}

    @router.get("/api/tags")
    async def tags(request: Request):
        state = request.app.state
        loaded = state.engine_thread.model
        specs, seen = ([loaded.spec] if loaded else []) + state.model_store.list(), set()
        models = []
        for spec in specs:
            if spec.id in seen:
                continue
            seen.add(spec.id)
            try:
                models.append(model_listing(spec, await run_in_threadpool(model_facts, state.model_store, spec)))
            except (OSError, ValueError):  # a file gone or damaged since it was installed
                continue
        return {"models": models}

    @router.post("/api/show")
    async def show(body: ShowRequest, request: Request):
        state = request.app.state
        name = body.model or body.name
        if not name:
            raise APIError(400, "model is required")
        mid, loaded = ollama_model_id(name), state.engine_thread.model
        if loaded is not None and mid in (loaded.spec.id, loaded.spec.name, Path(loaded.spec.path).name):
            spec = loaded.spec
        elif state.model_store.exists(mid):
            try:
                spec = state.model_store.get(mid)
            except (OSError, ValueError) as e:
                raise APIError(400, f"the manifest of {mid!r} is unusable: {e}") from None
        else:
            raise ollama_not_found(name)
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
        state = request.app.state
        loaded = state.engine_thread.model
        if loaded is None:
            return {"models": []}
        entry = model_listing(loaded.spec, await run_in_threadpool(model_facts, state.model_store, loaded.spec))
        on_gpu = not str(loaded.device).startswith("cpu")
        return {"models": [entry | {"size_vram": entry["size"] if on_gpu else 0,
                                    "context_length": loaded.engine.max_model_len}]}

    return router
