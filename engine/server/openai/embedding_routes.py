"""POST /v1/embeddings (OpenAI's shape) and POST /v1/rerank (the Jina/Cohere shape llama.cpp's
server answers); Ollama's /api/embed and /api/embeddings are engine/server/ollama/embeddings.py's.
The vectors come from engine/server/embeddings.py.

Rerank scores each document by the cosine similarity of its embedding to the query's (a
bi-encoder: what an embedding model such as all-MiniLM is trained for), highest first. A
cross-encoder reranker file (rank pooling: bge-reranker, jina-reranker) is refused in words: its
pair scoring is llama.cpp's rank pooling, which Ember does not run yet.

The vectors are L2-normalized, as Ollama's /api/embed's are.
"""
from __future__ import annotations

import base64
from typing import Annotated, Literal

import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from engine.server.embeddings import MAX_INPUTS, check_dimensions, l2_normalize
from engine.server.errors import APIError
from engine.server.openai.protocol import INT32_MAX, model_field
from engine.server.model_use import use_model

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


def build_embeddings_router() -> APIRouter:
    router = APIRouter()

    @router.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest, request: Request):
        state = request.app.state
        loaded = await use_model(request, body.model, text=False)
        res = await state.embeddings.run(state.engine_thread, loaded, body.inputs, request=request)
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
        loaded = await use_model(request, body.model, text=False)
        res = await state.embeddings.run(state.engine_thread, loaded, [body.query, *body.documents],
                                          request=request)
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

