"""`create_app(engine_thread, settings)`: the FastAPI app of the engine process.

The routes are each wire protocol's routers: openai/ (chat, completions, responses,
embeddings), ollama/, anthropic/, and the engine's own (admin_routes.py: /health, /v1/models,
/metrics, the GUI's /v1/engine/*). Everything is passed in (no module globals): the engine
thread (engine/service/) is built by the caller, started with the app and stopped with it.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from engine.server.admin_routes import build_admin_router
from engine.server.anthropic.routes import build_anthropic_router
from engine.server.auth import SecurityMiddleware, SecurityPolicy
from engine.server.documents import Documents
from engine.server.embeddings import Embeddings
from engine.server.errors import install_error_handlers
from engine.server.json_body import JSONBodyMiddleware
from engine.server.model_store import ModelStore
from engine.server.model_use import HoldsMiddleware
from engine.server.ollama.model_routes import build_ollama_models_router
from engine.server.ollama.pull import Puller
from engine.server.ollama.routes import build_ollama_router
from engine.server.openai.chat_routes import build_chat_router
from engine.server.openai.completions_routes import build_completions_router
from engine.server.openai.embedding_routes import build_embeddings_router
from engine.server.openai.files_routes import build_files_router
from engine.server.openai.responses_routes import build_responses_router
from engine.server.openai.vector_store_routes import build_vector_store_router
from engine.service.handle import EngineHandle
from engine.service.served_model import ModelSpec


@dataclass(frozen=True)
class ServerSettings:
    api_key: str | None = None
    models_dir: str | None = None
    allowed_hosts: tuple[str, ...] = ()  # extra Host names beyond loopback (remote binds)
    cors_origins: tuple[str, ...] = ()
    keyless_ports: tuple[int, ...] = ()  # ports where a client on this machine needs no key (Ollama's, if allowed)
    max_body_bytes: int = 16 << 20
    max_reasoning_tokens: int | None = None  # a reasoning model's thinking, capped unless a request says
    default_model: ModelSpec | None = None  # what a request that names no model gets when none is loaded
    docs_dir: str | None = None  # the documents store (Files, Vector Stores, file_search); None: those answer 503
    embedding_model: str | None = None  # the model that embeds documents (None: the first installed embedder)
    fetch_image_urls: bool = False  # an image part's http(s) URL is fetched (server/image_fetch.py), else a 400
    extra: dict = field(default_factory=dict)


def create_app(engine_thread: EngineHandle, settings: ServerSettings | None = None,
               puller: Puller | None = None) -> FastAPI:
    """`puller`: the app's downloads behind Ollama's /api/pull (None: that route answers 501)."""
    settings = settings or ServerSettings()

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        engine_thread.start()
        app.state.documents.resume(app.state)
        yield
        app.state.documents.close()
        await asyncio.to_thread(engine_thread.stop)

    app = FastAPI(title="Ember engine", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible local inference server.")
    app.state.engine_thread = engine_thread
    app.state.model_store = ModelStore(settings.models_dir)
    app.state.settings = settings
    app.state.puller = puller
    app.state.embeddings = Embeddings()  # llama.cpp's embeddings context, built on first use
    app.state.documents = Documents(settings.docs_dir, settings.embedding_model)  # opened on first use
    metrics = engine_thread.metrics
    install_error_handlers(app)
    app.include_router(build_chat_router())
    app.include_router(build_completions_router())
    app.include_router(build_embeddings_router())
    app.include_router(build_responses_router())
    app.include_router(build_files_router())
    app.include_router(build_vector_store_router())
    app.include_router(build_ollama_router())
    app.include_router(build_ollama_models_router())
    app.include_router(build_anthropic_router())
    app.include_router(build_admin_router())  # /health, /v1/models, /metrics, /v1/engine/*

    # outermost last: metrics → security (Host, Origin, key, size) → CORS → JSON bodies → holds →
    # routes, so that a refused origin gets an OpenAI-shaped 403 and not CORS's plain-text 400, and
    # a body is read as JSON only once the request is allowed
    app.add_middleware(HoldsMiddleware, thread=engine_thread)  # a request's models, released at its end
    app.add_middleware(JSONBodyMiddleware)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type", "x-api-key"])
    app.add_middleware(SecurityMiddleware, policy=SecurityPolicy.build(
        settings.api_key, settings.allowed_hosts, settings.cors_origins, settings.keyless_ports,
        max_body_bytes=settings.max_body_bytes))
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)  # counts refusals too
    return app


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
