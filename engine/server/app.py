"""`create_app(engine_thread, settings)`: the FastAPI app of the engine process.

Routes: the OpenAI ones (chat_routes.py, openai_routes.py, responses_api.py, embedding_routes.py), /v1/models, /health, /metrics and the GUI's
/v1/engine/{status,load,unload}. Everything is passed in (no module globals); the engine thread
is started with the app and stopped with it.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse

from engine.server import heap
from engine.server.auth import SecurityMiddleware, SecurityPolicy
from engine.server.engine_thread import EngineThread
from engine.server.errors import APIError, install_error_handlers
from engine.server.model_store import ModelNotFound, ModelStore
from engine.server.chat_routes import build_chat_router
from engine.server.embedding_routes import build_embeddings_router
from engine.server.embeddings import Embeddings
from engine.server.openai_routes import build_router
from engine.server.responses_api import build_responses_router
from engine.server.ollama_pull import Puller
from engine.server.ollama_model_routes import build_ollama_models_router
from engine.server.ollama_routes import build_ollama_router
from engine.server.anthropic_routes import build_anthropic_router
from engine.server.protocol import LoadModelRequest
from engine.server.reasoning import thinking_switches


@dataclass(frozen=True)
class ServerSettings:
    api_key: str | None = None
    models_dir: str | None = None
    allowed_hosts: tuple[str, ...] = ()  # extra Host names beyond loopback (remote binds)
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = 16 << 20
    max_reasoning_tokens: int | None = None  # a reasoning model's thinking, capped unless a request says
    extra: dict = field(default_factory=dict)


def create_app(engine_thread: EngineThread, settings: ServerSettings | None = None,
               puller: Puller | None = None) -> FastAPI:
    """`puller`: the app's downloads behind Ollama's /api/pull (None: that route answers 501)."""
    settings = settings or ServerSettings()

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        engine_thread.start()
        yield
        await asyncio.to_thread(engine_thread.stop)

    app = FastAPI(title="Ember engine", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible local inference server.")
    app.state.engine_thread = engine_thread
    app.state.model_store = ModelStore(settings.models_dir)
    app.state.settings = settings
    app.state.puller = puller
    app.state.embeddings = Embeddings()  # llama.cpp's embeddings context, built on first use
    metrics = engine_thread.metrics
    install_error_handlers(app)
    app.include_router(build_chat_router())
    app.include_router(build_router())
    app.include_router(build_embeddings_router())
    app.include_router(build_responses_router())
    app.include_router(build_ollama_router())
    app.include_router(build_ollama_models_router())
    app.include_router(build_anthropic_router())

    @app.get("/health")
    async def health():
        return _health(engine_thread)

    @app.get("/v1/models")
    async def models():
        loaded = engine_thread.model
        entries, seen = [], set()
        specs = ([loaded.spec] if loaded else []) + app.state.model_store.list()
        for spec in specs:
            if spec.id in seen:
                continue
            seen.add(spec.id)
            entries.append({"id": spec.id, "object": "model", "created": 0, "owned_by": "ember",
                            "name": spec.name, "format": spec.format,
                            "loaded": bool(loaded and loaded.spec.id == spec.id)})
        return {"object": "list", "data": entries}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(engine_thread.stats, engine_thread.state),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/engine/status")
    async def status():
        d = _health(engine_thread)
        s = engine_thread.stats
        d["kv"] = ({"blocks_used": s.kv_blocks_used, "blocks_total": s.kv_blocks_total,
                    "block_size": s.block_size, "tokens_cached": s.cached_tokens,
                    "prefix_hit_rate": s.prefix_hit_rate} if s is not None else None)
        d["num_running"] = s.num_running if s is not None else 0
        d["num_waiting"] = s.num_waiting if s is not None else 0
        d["max_model_len"] = s.max_model_len if s is not None else None
        d["num_requests"] = engine_thread.num_requests
        d["generation_tok_s"] = round(metrics.generation_tok_s(), 2)
        loaded = engine_thread.model
        if loaded is not None:  # what the GUI's per-chat Think switch may ask of this model
            d["thinking"] = thinking_switches(loaded.engine.chat_template)
            d["embeds_only"] = not loaded.generates  # an embedding model: no chats on it
        spec = s.spec if s is not None else None
        if spec is not None:
            d["speculative"] = {
                "drafter": spec.drafter, "draft_tokens": spec.num_proposed, "accepted_tokens": spec.num_accepted,
                "acceptance_rate": spec.acceptance_rate, "mean_accepted_length": spec.mean_accepted,
                "tokens_per_target_pass": spec.tokens_per_pass, "draft_seconds": round(spec.draft_seconds, 3),
                "verify_seconds": round(spec.verify_seconds, 3)}
        if heap.enabled():  # a soak's view of what the process holds (engine/server/heap.py)
            d["heap"] = heap.heap_report(engine_thread.trimmer)
        return d

    @app.post("/v1/engine/load")
    async def load(body: LoadModelRequest):
        try:
            spec = app.state.model_store.get(body.model)
        except ModelNotFound as e:
            raise APIError(404, str(e), code="model_not_found", param="model") from None
        except (OSError, ValueError) as e:
            raise APIError(400, f"the manifest of {body.model!r} is unusable: {e}", code="invalid_manifest") from None
        fut = engine_thread.load(spec)
        if not body.wait:
            return JSONResponse(_health(engine_thread), status_code=202)
        try:
            await asyncio.wrap_future(fut)
        except (OSError, ValueError, RuntimeError, MemoryError) as e:
            # a missing or malformed file, or a model that does not fit: the message says which,
            # and the engine's status whether the model loaded before it serves again
            said = engine_thread.message
            why = said if said.startswith(f"loading {spec.id} failed: ") else f"loading {spec.id} failed: {e}"
            raise APIError(400, why, code="model_load_failed") from None
        return _health(engine_thread)

    @app.post("/v1/engine/unload")
    async def unload():
        await asyncio.wrap_future(engine_thread.unload())
        return _health(engine_thread)

    # outermost last: metrics → security (Host, Origin, key, size) → CORS → routes, so that a
    # refused origin gets an OpenAI-shaped 403 and not CORS's plain-text 400
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type", "x-api-key"])
    app.add_middleware(SecurityMiddleware, policy=SecurityPolicy.build(
        settings.api_key, settings.allowed_hosts, settings.cors_origins,
        max_body_bytes=settings.max_body_bytes))
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)  # counts refusals too
    return app


def _health(t: EngineThread) -> dict:
    loaded = t.model
    spec = loaded.spec if loaded else t.loading
    return {"status": t.state, "message": t.message, "model": spec.id if spec else None,
            "backend": loaded.backend if loaded else None, "device": loaded.device if loaded else None,
            "decision": loaded.decision if loaded else None}


class RequestMetricsMiddleware:
    """Counts requests by endpoint and status (ASGI, so streams are not buffered)."""

    KNOWN = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/rerank", "/v1/models", "/health",
             "/metrics", "/v1/engine/status", "/v1/engine/load", "/v1/engine/unload")

    def __init__(self, app, metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"] if scope["path"] in self.KNOWN else "other"
        status = {"code": 500}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.requests.inc(endpoint=path, status=str(status["code"]))
