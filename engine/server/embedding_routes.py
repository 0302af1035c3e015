"""POST /v1/embeddings (OpenAI's shape), and the replies of Ollama's /api/embed and /api/embeddings
(routed in ollama_routes.py, where its error shape is). The vectors come from embeddings.py.

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
        loaded = require_model(state.engine_thread, state.model_store, body.model)
        res = await state.embeddings.run(loaded, body.inputs)
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

    return router


def ollama_embed_reply(model: str, res: EmbedResult, dimensions: int | None, t0: float) -> dict:
    check_dimensions(dimensions, len(res.vectors[0]))
    return {"model": model, "embeddings": [l2_normalize(v).tolist() for v in res.vectors],
            "total_duration": int((time.monotonic() - t0) * 1e9),
            "load_duration": int(res.load_seconds * 1e9), "prompt_eval_count": sum(res.num_tokens)}


def ollama_embeddings_reply(res: EmbedResult) -> dict:
    return {"embedding": np.asarray(res.vectors[0], dtype=np.float32).tolist()}
