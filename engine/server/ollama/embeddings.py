"""Ollama's /api/embed and /api/embeddings bodies (routed in routes.py, where its error shape is);
the vectors are engine/server/embeddings.py's, as on OpenAI's /v1/embeddings.

/api/embed's vectors are L2-normalized; the legacy /api/embeddings returns the pooled vector as
it is, as Ollama does (ollama/ollama#8094).
"""
from __future__ import annotations

import time
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from engine.server.embeddings import MAX_INPUTS, EmbedResult, check_dimensions, l2_normalize
from engine.server.openai.protocol import INT32_MAX

_config = ConfigDict(extra="ignore", allow_inf_nan=False)


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


def ollama_embed_reply(model: str, res: EmbedResult, dimensions: int | None, t0: float) -> dict:
    check_dimensions(dimensions, len(res.vectors[0]))
    return {"model": model, "embeddings": [l2_normalize(v).tolist() for v in res.vectors],
            "total_duration": int((time.monotonic() - t0) * 1e9),
            "load_duration": int(res.load_seconds * 1e9), "prompt_eval_count": sum(res.num_tokens)}


def ollama_embeddings_reply(res: EmbedResult) -> dict:
    return {"embedding": np.asarray(res.vectors[0], dtype=np.float32).tolist()}
