"""EngineClient: the one piece of code that speaks HTTP to the engine (or any OpenAI-compatible server).

Qt-free and blocking: the GUI calls it from worker threads. `chat_stream` returns a ChatStream
(app/openai_stream.py) that yields ChatDelta objects; closing (or cancelling) it closes the HTTP
response, so the engine sees the disconnect, aborts the sequence and frees its KV blocks.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from app.doc_sources import parse_sources
from app.openai_stream import (ChatDelta, ChatStream, EngineClientError, ToolCall, Usage, describe,
                               error_from_response, error_message, parse_usage, sse_events)

__all__ = ["ChatDelta", "ChatStream", "EngineClient", "EngineClientError", "ToolCall", "Usage", "sse_events"]

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
STREAM_TIMEOUT = httpx.Timeout(connect=5.0, read=600.0, write=30.0, pool=30.0)  # a long prefill may be slow
LOAD_TIMEOUT = httpx.Timeout(connect=5.0, read=1800.0, write=30.0, pool=30.0)  # loading a big model


class EngineClient:
    """HTTP client of an OpenAI-compatible server; `base_url` with or without the trailing /v1."""

    def __init__(self, base_url: str, api_key: str | None = None,
                 timeout: float | httpx.Timeout = DEFAULT_TIMEOUT) -> None:
        base = base_url.strip().rstrip("/")
        base = base.removesuffix("/v1")
        if not base.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, not {base_url!r}")
        self.base_url = base
        self.api_key = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base, headers=headers, timeout=timeout,
                                  limits=httpx.Limits(max_connections=256, max_keepalive_connections=32))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plain requests ----
    def _request(self, method: str, path: str, json_body: Any = None, timeout: Any = None,
                 **kwargs: Any) -> httpx.Response:
        if timeout is not None:
            kwargs["timeout"] = timeout
        try:
            response = self._http.request(method, path, json=json_body, **kwargs)
        except httpx.HTTPError as e:
            raise EngineClientError(f"cannot reach the server at {self.base_url}: {describe(e)}") from e
        if response.status_code >= 400:
            raise error_from_response(response)
        return response

    def _json(self, method: str, path: str, json_body: Any = None, timeout: Any = None) -> Any:
        response = self._request(method, path, json_body, timeout)
        try:
            return response.json()
        except ValueError:
            raise EngineClientError(f"{path} answered with something that is not JSON",
                                    response.status_code) from None

    def health(self) -> dict:
        """{"status": "loading"|"ready"|"error"|"unloaded", ...}, normalised across servers; raises when unreachable."""
        try:
            response = self._http.get("/health")
        except httpx.HTTPError as e:
            raise EngineClientError(f"cannot reach the server at {self.base_url}: {describe(e)}") from e
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code == 404:  # Ollama and others: no /health; a model list means ready
            self.models()
            return {"status": "ready"}
        if isinstance(body, dict) and body.get("status") in ("loading", "ready", "error", "unloaded"):
            return body  # Ember's engine
        if response.status_code == 503:  # llama.cpp's server while loading
            message = error_message(body) or "loading"
            return {"status": "loading", "message": message}
        if response.status_code >= 400:
            raise error_from_response(response)
        return {**(body if isinstance(body, dict) else {}), "status": "ready"}  # vLLM: empty 200; llama.cpp: "ok"

    def status(self) -> dict:
        """Ember's /v1/engine/status; another server gets a summary built from /health and /v1/models."""
        try:
            return self._json("GET", "/v1/engine/status")
        except EngineClientError as e:
            if e.status_code not in (404, 405):
                raise
        health = self.health()
        models = self.models()
        return {**health, "model": models[0]["id"] if models else None, "remote": True}

    def models(self) -> list[dict]:
        """The `data` list of /v1/models: dicts with at least "id"."""
        body = self._json("GET", "/v1/models")
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise EngineClientError("/v1/models answered without a data list")
        return [m for m in data if isinstance(m, dict) and "id" in m]

    def load_model(self, model_id: str) -> dict:
        """Ask the engine to load a model of its store by id; answers once it is loaded (or failed)."""
        return self._json("POST", "/v1/engine/load", {"model": model_id}, timeout=LOAD_TIMEOUT)

    def unload_model(self, model_id: str | None = None) -> dict:
        """Unload one model (once its running replies end), or every model when `model_id` is None."""
        body = {"model": model_id} if model_id else {}
        return self._json("POST", "/v1/engine/unload", body, timeout=LOAD_TIMEOUT)

    # ---- documents: OpenAI's Files and Vector Stores ----
    def upload_file(self, path: Path | str, purpose: str = "assistants") -> dict:
        """POST /v1/files (multipart): the File object, whose id a vector store takes."""
        path = Path(path)
        with path.open("rb") as f:
            response = self._request("POST", "/v1/files", files={"file": (path.name, f)},
                                     data={"purpose": purpose}, timeout=LOAD_TIMEOUT)
        return response.json()

    def files(self) -> list[dict]:
        """Every uploaded (or CLI-added) file: id, filename, bytes."""
        return self._pages("/v1/files")

    def delete_file(self, file_id: str) -> dict:
        return self._json("DELETE", f"/v1/files/{file_id}")

    def _pages(self, path: str) -> list[dict]:
        """Every item of an OpenAI cursor listing, oldest first."""
        items: list[dict] = []
        after = None
        while True:
            query = "?limit=100&order=asc" + (f"&after={after}" if after else "")
            body = self._json("GET", path + query)
            items += body.get("data") or []
            if not body.get("has_more") or not items:
                return items
            after = items[-1]["id"]

    def vector_stores(self) -> list[dict]:
        return self._pages("/v1/vector_stores")

    def create_vector_store(self, name: str, metadata: dict[str, str] | None = None) -> dict:
        return self._json("POST", "/v1/vector_stores", {"name": name, "metadata": metadata or {}})

    def rename_vector_store(self, store_id: str, name: str) -> dict:
        return self._json("POST", f"/v1/vector_stores/{store_id}", {"name": name})

    def delete_vector_store(self, store_id: str) -> dict:
        return self._json("DELETE", f"/v1/vector_stores/{store_id}")

    def attach_file(self, store_id: str, file_id: str, attributes: dict | None = None) -> dict:
        """Add an uploaded file to a store; the engine indexes it in the background (status in_progress)."""
        body = {"file_id": file_id} | ({"attributes": attributes} if attributes else {})
        return self._json("POST", f"/v1/vector_stores/{store_id}/files", body)

    def vector_store_files(self, store_id: str) -> list[dict]:
        """The store's files with their status (in_progress: Ember's `progress`), attributes and error."""
        return self._pages(f"/v1/vector_stores/{store_id}/files")

    def vector_store_file(self, store_id: str, file_id: str) -> dict:
        return self._json("GET", f"/v1/vector_stores/{store_id}/files/{file_id}")

    def detach_file(self, store_id: str, file_id: str) -> dict:
        return self._json("DELETE", f"/v1/vector_stores/{store_id}/files/{file_id}")

    # ---- generation ----
    def _body(self, messages: list[dict], model: str | None, sampling: dict[str, Any]) -> dict:
        model = model or self._model()
        body = {"messages": messages, **{k: v for k, v in sampling.items() if v is not None}}
        if model:
            body["model"] = model
        return body

    def _model(self) -> str | None:
        """Servers other than Ember's need a model name: the first one they list (Ember lists the loaded
        one first). Asked each time, since another client may have switched the model meanwhile."""
        try:
            models = self.models()
        except EngineClientError:
            return None
        if any("loaded" in m for m in models):  # Ember says which one is loaded (maybe none)
            return next((m["id"] for m in models if m.get("loaded")), None)
        return models[0]["id"] if models else None

    def chat_stream(self, messages: list[dict], model: str | None = None, *, include_usage: bool = True,
                    documents: dict | None = None, **sampling: Any) -> ChatStream:
        """Start a streamed chat completion; sampling keywords (temperature, top_p, max_tokens, stop,
        seed, ...) go into the request body as they are. `documents` ({"vector_store_ids": [...]}, Ember's
        extension) answers from those stores: the stream's first delta carries the passages as `sources`.
        Raises EngineClientError for a refused request."""
        body = self._body(messages, model, sampling) | {"stream": True}
        if documents:
            body["documents"] = documents
        if include_usage:
            body["stream_options"] = {"include_usage": True}
        request = self._http.build_request("POST", "/v1/chat/completions", json=body, timeout=STREAM_TIMEOUT)
        t_sent = time.perf_counter()
        try:
            response = self._http.send(request, stream=True)
        except httpx.HTTPError as e:
            raise EngineClientError(f"cannot reach the server at {self.base_url}: {describe(e)}") from e
        if response.status_code >= 400:
            try:
                response.read()
            finally:
                response.close()
            raise error_from_response(response)
        return ChatStream(response, t_sent)

    def warm(self, messages: list[dict], model: str | None = None, **fields: Any) -> dict:
        """Ember's engine computes the chat's prompt into its prefix cache, as background work, so the
        next turn starts at once (POST /v1/engine/warm); answers once done: {"prompt_tokens",
        "cached_tokens"}. `fields`: what the next turn sends besides its messages (e.g. tools)."""
        body = {"messages": messages, **{k: v for k, v in fields.items() if v is not None}}
        if model:
            body["model"] = model
        return self._json("POST", "/v1/engine/warm", body, timeout=STREAM_TIMEOUT)

    def chat(self, messages: list[dict], model: str | None = None, **sampling: Any) -> ChatDelta:
        """A whole reply in one request (no streaming): its text, finish reason, usage, tool calls
        and thinking."""
        body = self._body(messages, model, sampling) | {"stream": False}
        t_sent = time.perf_counter()
        reply = self._json("POST", "/v1/chat/completions", body, timeout=STREAM_TIMEOUT)
        try:
            choice = reply["choices"][0]
            message = choice["message"]
            text = message.get("content") or ""
            calls = tuple(ToolCall(c.get("id") or "", c["function"]["name"], c["function"].get("arguments") or "")
                          for c in message.get("tool_calls") or ())
        except (KeyError, IndexError, TypeError, AttributeError):
            raise EngineClientError("the server's chat completion has no choices or a malformed call") from None
        return ChatDelta(text, choice.get("finish_reason"), parse_usage(reply.get("usage")),
                         None, time.perf_counter() - t_sent, message.get("reasoning_content") or "", calls,
                         parse_sources(reply.get("sources")))
