"""POST /v1/embeddings (OpenAI's shape), POST /v1/rerank (the Jina/Cohere shape llama.cpp's server
answers), and the replies of Ollama's /api/embed and /api/embeddings (routed in ollama_routes.py,
where its error shape is). The vectors come from embeddings.py.

Rerank scores each document by the cosine similarity of its embedding to the query's (a
bi-encoder: what an embedding model such as all-MiniLM is trained for), highest first. A
cross-encoder reranker file (rank pooling: bge-reranker, jina-reranker) is refused in words: its
pair scoring is llama.cpp's rank pooling, which Ember does not run yet.

OpenAI's and Ollama's /api/embed vectors are L2-normalized; Ollama's legacy /api/embeddings
returns the pooled vector as it is, as Ollama does (ollama/ollama#8094).
"""
from __future__ import annotations

import base64
import time
from typing import Annotated, Literal

import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from engine.server.embeddings import MAX_INPUTS, EmbedResult, l2_normalize
from engine.server.errors import APIError
from engine.server.protocol import INT32_MAX, model_field
from engine.server.serving import require_model

_config = ConfigDict(extra="ignore", allow_inf_nan=False)
TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=INT32_MAX)]], Field(min_length=1)]


class EmbeddingRequest(BaseModel):
    """OpenAI's: `input` a string, a list of strings, a list of token ids or a list of such lists."""
    model_config = _config
    input: str | Annotated[list[str], Field(max_length=MAX_INPUTS)] | TokenIds | \
        Annotated[list[TokenIds], Field(max_length=MAX_INPUTS)]
    model: str | None = model_field
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, le=INT32_MAX)
    user: str | None = None

    @property
    def inputs(self) -> list[str | list[int]]:
        x = self.input
        if isinstance(x, str) or (x and isinstance(x[0], int)):
            return [x]
        return list(x)


class OllamaEmbedRequest(BaseModel):
    model_config = _config
    model: str
    input: str | Annotated[list[str], Field(max_length=MAX_INPUTS)]
    truncate: bool = True  # Ollama's default: an input over the context keeps its first tokens
    dimensions: int | None = Field(None, ge=1, le=INT32_MAX)
    options: dict | None = None
    keep_alive: str | int | float | None = None


class OllamaEmbeddingsRequest(BaseModel):
    model_config = _config
    model: str
    prompt: str
    options: dict | None = None
    keep_alive: str | int | float | None = None


class RerankRequest(BaseModel):
    model_config = _config
    model: str | None = model_field
    query: str = Field(min_length=1)
    documents: Annotated[list[str], Field(min_length=1, max_length=MAX_INPUTS - 1)]
    top_n: int | None = Field(None, ge=1, le=INT32_MAX)
    return_documents: bool = False


def rerank_results(query: np.ndarray, docs: list[np.ndarray], top_n: int | None) -> list[tuple[int, float]]:
    """(document index, cosine similarity to the query), highest first (ties: the earlier
    document), at most top_n."""
    q = l2_normalize(query).astype(np.float64)
    scores = [float(l2_normalize(d).astype(np.float64) @ q) for d in docs]
    ranked = sorted(enumerate(scores), key=lambda r: (-r[1], r[0]))
    return ranked[:top_n]


def check_dimensions(dimensions: int | None, size: int) -> None:
    """No model here is trained to be cut short (Matryoshka): only its own size is accepted."""
    if dimensions is not None and dimensions != size:
        raise APIError(400, f"dimensions {dimensions} is not supported: this model's embeddings have "
                       f"{size} dimensions (omit it or pass {size})", code="invalid_value", param="dimensions")


def build_embeddings_router() -> APIRouter:
    router = APIRouter()

    @router.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest, request: Request):
        state = request.app.state
        loaded = require_model(state.engine_thread, state.model_store, body.model, text=False)
        res = await state.embeddings.run(request, loaded, body.inputs)
        size = len(res.vectors[0])
        check_dimensions(body.dimensions, size)
        data = []
        for i, v in enumerate(res.vectors):
            u = l2_normalize(v)
            emb = (base64.b64encode(u.astype("<f4").tobytes()).decode() if body.encoding_format == "base64"
                   else u.tolist())
            data.append({"object": "embedding", "index": i, "embedding": emb})
        n = sum(res.num_tokens)
        return {"object": "list", "data": data, "model": loaded.spec.id,
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    @router.post("/v1/rerank")
    @router.post("/rerank")
    async def rerank(body: RerankRequest, request: Request):
        state = request.app.state
        loaded = require_model(state.engine_thread, state.model_store, body.model, text=False)
        res = await state.embeddings.run(request, loaded, [body.query, *body.documents])
        if res.ranker:
            raise APIError(400, f"{loaded.spec.id!r} is a cross-encoder reranker (rank pooling), which Ember "
                           "does not run yet; load an embedding or chat model to rerank by similarity",
                           code="invalid_model", param="model")
        results = []
        for i, score in rerank_results(res.vectors[0], res.vectors[1:], body.top_n):
            item = {"index": i, "relevance_score": score}
            if body.return_documents:
                item["document"] = {"text": body.documents[i]}
            results.append(item)
        n = sum(res.num_tokens)
        return {"object": "list", "model": loaded.spec.id, "results": results,
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    return router


def ollama_embed_reply(model: str, res: EmbedResult, dimensions: int | None, t0: float) -> dict:
    check_dimensions(dimensions, len(res.vectors[0]))
    return {"model": model, "embeddings": [l2_normalize(v).tolist() for v in res.vectors],
            "total_duration": int((time.monotonic() - t0) * 1e9),
            "load_duration": int(res.load_seconds * 1e9), "prompt_eval_count": sum(res.num_tokens)}


def ollama_embeddings_reply(res: EmbedResult) -> dict:
    return {"embedding": np.asarray(res.vectors[0], dtype=np.float32).tolist()}
