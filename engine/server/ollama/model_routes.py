"""Ollama's model routes: /api/version, /api/tags, /api/show, /api/ps and /api/pull. What they say
of a model is models.py's; a pull is the app's downloads (pull.py). Errors are
Ollama's shape, as on its chat routes (routes.py)."""
from __future__ import annotations

from datetime import datetime, timezone

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from engine.server.errors import APIError
from engine.server.ollama.models import facts as model_facts, listing as model_listing, show as model_show
from engine.server.ollama.protocol import PullRequest, ShowRequest
from engine.server.ollama.pull import pull_reply
from engine.server.ollama.routes import OllamaRoute, ollama_error, ollama_spec

FOREVER = datetime(2318, 1, 1, tzinfo=timezone.utc)  # Ollama's expires_at for keep_alive -1 is as far


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
        spec = ollama_spec(state, name)
        loaded = next((m.model for m in state.engine_thread.models if m.spec.id == spec.id), None)
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
    """/api/tags: the loaded models first, then the store's, each once; a file gone or damaged
    since it was installed is left out."""
    specs, seen = [m.spec for m in state.engine_thread.models] + state.model_store.list(), set()
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


async def _running(state) -> list[dict]:
    """/api/ps: every loaded model, with its memory (what the budget counts; on the GPU or not),
    its context and when it unloads if it stays idle (Ollama's expires_at; far ahead: it stays)."""
    out = []
    for m in state.engine_thread.models:
        if m.model is None:
            continue
        entry = model_listing(m.spec, await run_in_threadpool(model_facts, state.model_store, m.spec))
        on_gpu = not str(m.model.device).startswith("cpu")
        expires = FOREVER if m.expires_at is None else datetime.fromtimestamp(m.expires_at, timezone.utc)
        out.append(entry | {"size": m.bytes or entry["size"], "size_vram": (m.bytes or entry["size"]) if on_gpu else 0,
                            "context_length": m.model.engine.max_model_len,
                            "expires_at": expires.isoformat().replace("+00:00", "Z")})
    return out
