"""The engine's own routes: /health, /v1/models, /metrics and the GUI's /v1/engine/{status,load,unload,warm}.

Each reads the engine thread's published status; a load or unload is posted to the thread and
awaited (or, for a load with `wait: false`, answered 202 at once).
"""
from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from engine.model_files.manifest import MODEL_ID_PATTERN
from engine.server.errors import APIError
from engine.server.model_store import ModelNotFound, ModelStore
from engine.server.openai.protocol import ChatCompletionRequest
from engine.server.reasoning import thinking_switches
from engine.service import heap
from engine.service.handle import EngineHandle
from engine.service.model_set import QueueFull
from engine.service.status_snapshot import failed_load_words
from engine.server.residency_status import residency_status
from engine.server.warm import warm_chat


class LoadModelRequest(BaseModel):
    """POST /v1/engine/load's body (Ember's own API, the GUI's)."""
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)
    model: Annotated[str, StringConstraints(pattern=MODEL_ID_PATTERN)]
    wait: bool = Field(True, description="Answer once the model is loaded (or failed).")
    keep_alive: float | None = Field(None, description="Seconds it stays once idle (default: until unloaded).")


class UnloadModelRequest(BaseModel):
    """POST /v1/engine/unload's body: one model, or (none named) every model."""
    model_config = ConfigDict(extra="ignore")
    model: Annotated[str, StringConstraints(pattern=MODEL_ID_PATTERN)] | None = None


def build_admin_router() -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health(request: Request):
        return health_body(request.app.state.engine_thread)

    @router.get("/v1/models")
    async def models(request: Request):
        return model_list(request.app.state.engine_thread, request.app.state.model_store)

    @router.get("/metrics")
    async def prometheus(request: Request):
        t = request.app.state.engine_thread
        return PlainTextResponse(t.metrics.render(t.stats, t.state),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @router.get("/v1/engine/status")
    async def status(request: Request):
        return engine_status(request.app.state.engine_thread)

    @router.post("/v1/engine/load")
    async def load(body: LoadModelRequest, request: Request):
        return await _load(request.app.state.engine_thread, request.app.state.model_store, body)

    @router.post("/v1/engine/unload")
    async def unload(request: Request, body: UnloadModelRequest | None = None):
        """Unloads now, or (a model with replies running) as soon as they end: nothing is cut."""
        t = request.app.state.engine_thread
        await asyncio.wrap_future(t.unload(body.model if body else None))
        return health_body(t)

    @router.post("/v1/engine/warm")
    async def warm(body: ChatCompletionRequest, request: Request):
        """A chat's prompt into the prefix cache, as background work (engine/server/warm.py)."""
        return await warm_chat(request, body)

    return router


def health_body(t: EngineHandle) -> dict:
    loaded = t.model
    spec = loaded.spec if loaded else t.loading
    return {"status": t.state, "message": t.message, "model": spec.id if spec else None,
            "backend": loaded.backend if loaded else None, "device": loaded.device if loaded else None,
            "decision": loaded.decision if loaded else None}


def model_list(t: EngineHandle, store: ModelStore) -> dict:
    """The loaded models first (most recently used first), then the store's, each once."""
    loaded = {m.spec.id for m in t.models if m.state == "ready"}
    entries, seen = [], set()
    for spec in [m.spec for m in t.models] + store.list():
        if spec.id in seen:
            continue
        seen.add(spec.id)
        entries.append({"id": spec.id, "object": "model", "created": 0, "owned_by": "ember",
                        "name": spec.name, "format": spec.format, "loaded": spec.id in loaded})
    return {"object": "list", "data": entries}


def engine_status(t: EngineHandle) -> dict:
    """/health plus what the GUI shows: the KV cache, the queue, speed and speculation."""
    d = health_body(t)
    s = t.stats
    d["kv"] = ({"blocks_used": s.kv_blocks_used, "blocks_total": s.kv_blocks_total,
                "block_size": s.block_size, "tokens_cached": s.cached_tokens,
                "prefix_hit_rate": s.prefix_hit_rate, "bytes_reserved": s.kv_bytes} if s is not None else None)
    d["weight_bytes"] = s.weight_bytes if s is not None else None  # the loaded model's own figures
    d["threads"] = s.num_threads if s is not None else None
    d["num_running"] = s.num_running if s is not None else 0
    d["num_waiting"] = s.num_waiting if s is not None else 0
    d["max_model_len"] = s.max_model_len if s is not None else None
    d["num_requests"] = t.num_requests
    d["generation_tok_s"] = round(t.metrics.generation_tok_s(), 2)
    loaded = t.model
    if loaded is not None:  # what the GUI's per-chat Think switch may ask of this model
        d["thinking"] = thinking_switches(loaded.engine.chat_template)
        d["embeds_only"] = not loaded.generates  # an embedding model: no chats on it
        d["completion_only"] = loaded.engine.chat_template.plain_layout  # a base model: no chat template
    spec = s.spec if s is not None else None
    if spec is not None:
        d["speculative"] = {
            "drafter": spec.drafter, "draft_tokens": spec.num_proposed, "accepted_tokens": spec.num_accepted,
            "acceptance_rate": spec.acceptance_rate, "mean_accepted_length": spec.mean_accepted,
            "tokens_per_target_pass": spec.tokens_per_pass, "draft_seconds": round(spec.draft_seconds, 3),
            "verify_seconds": round(spec.verify_seconds, 3)}
    d |= residency_status(t.status)
    if heap.enabled():  # a soak's view of what the process holds (engine/service/heap.py)
        d["heap"] = heap.heap_report(t.trimmer)
    return d


async def _load(t: EngineHandle, store: ModelStore, body: LoadModelRequest):
    try:
        spec = store.get(body.model)
    except ModelNotFound as e:
        raise APIError(404, str(e), code="model_not_found", param="model") from None
    except (OSError, ValueError) as e:
        raise APIError(400, f"the manifest of {body.model!r} is unusable: {e}", code="invalid_manifest") from None
    fut = t.load(spec, body.keep_alive)
    if not body.wait:
        return JSONResponse(health_body(t), status_code=202)
    try:
        await asyncio.wrap_future(fut)
    except QueueFull as e:
        raise APIError(503, str(e), code="queue_full", headers={"Retry-After": "10"}) from None
    except (OSError, ValueError, RuntimeError, MemoryError) as e:
        # a missing or malformed file, or a model that does not fit: the message says which, and
        # which models serve on (the status may not have been published yet: say it from here)
        serving = [m.spec.id for m in t.models if m.state == "ready" and m.spec.id != spec.id]
        raise APIError(400, failed_load_words(f"loading {spec.id} failed: {e}", serving),
                       code="model_load_failed") from None
    return health_body(t)
