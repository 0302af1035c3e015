"""EngineClient: the one piece of code that speaks HTTP to the engine (or any OpenAI-compatible server).

Qt-free and blocking: the GUI calls it from worker threads. `chat_stream` parses the SSE stream into
`ChatDelta`s and measures time to first token and decode speed on the client side, so the figures
mean the same thing against Ember's engine, vLLM, llama.cpp's server or Ollama. Closing (or
cancelling) a stream closes its HTTP response: the engine sees the disconnect and aborts the
sequence, freeing its KV blocks.
"""
from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
STREAM_TIMEOUT = httpx.Timeout(connect=5.0, read=600.0, write=30.0, pool=30.0)  # a long prefill may be slow
LOAD_TIMEOUT = httpx.Timeout(connect=5.0, read=1800.0, write=30.0, pool=30.0)  # loading a big model
MAX_ERROR_BODY = 64 * 1024


class EngineClientError(RuntimeError):
    """A failed request, with the server's own message when it sent one (OpenAI error shape)."""

    def __init__(self, message: str, status_code: int | None = None, type: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status_code, self.type, self.code = message, status_code, type, code


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache, when the server says


@dataclass(frozen=True, slots=True)
class ChatDelta:
    """One step of a streamed reply. Timing is measured here, on the client.

    ttft: seconds from sending the request to the first text; tok_s: decode speed so far,
    (tokens after the first) / (seconds since the first), exact once `usage` has arrived.
    """

    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    tok_s: float | None = None
    ttft: float | None = None


class ChatStream(Iterator[ChatDelta]):
    """An open streaming response; iterate for deltas. `close()` (or `cancel()` from another thread) aborts it."""

    def __init__(self, response: httpx.Response, t_sent: float) -> None:
        self._response = response
        self._events = _sse_events(response.iter_lines())
        self._t_sent = t_sent
        self._t_first: float | None = None
        self._t_last: float | None = None
        self._chunks = 0  # chunks that carried text: one token each on most servers
        self._cancelled = threading.Event()
        self._closed = False
        self.text = ""
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.id: str | None = None
        self.model: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self._t_first is None else self._t_first - self._t_sent

    @property
    def tok_s(self) -> float | None:
        tokens = self.usage.completion_tokens if self.usage is not None else self._chunks
        if self._t_first is None or self._t_last is None or tokens < 2 or self._t_last <= self._t_first:
            return None
        return (tokens - 1) / (self._t_last - self._t_first)

    def __iter__(self) -> ChatStream:
        return self

    def __next__(self) -> ChatDelta:
        while True:
            if self._closed:
                raise StopIteration
            try:
                data = next(self._events)
            except StopIteration:
                self.close()
                raise
            except (httpx.HTTPError, OSError) as e:
                self.close()
                if self._cancelled.is_set():
                    raise StopIteration from None
                raise EngineClientError(f"the connection to the server was lost mid-reply ({_describe(e)})") from e
            if data == "[DONE]":
                self.close()
                raise StopIteration
            delta = self._parse(data)
            if delta is not None:
                return delta

    def _parse(self, data: str) -> ChatDelta | None:
        try:
            chunk = json.loads(data)
        except ValueError:
            log.warning("skipping a malformed stream event: %.200r", data)
            return None
        if not isinstance(chunk, dict):
            return None
        if "error" in chunk:  # an error after the stream started (engine failure, model unloaded)
            self.close()
            raise _error_from_body(chunk, None)
        self.id = self.id or chunk.get("id")
        self.model = self.model or chunk.get("model")
        text, finish = "", None
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            text = (choice.get("delta") or {}).get("content") or ""
            finish = choice.get("finish_reason")
        usage = _usage(chunk.get("usage"))
        now = time.perf_counter()
        if text:
            self._t_first = self._t_first or now
            self._t_last = now
            self._chunks += 1
            self.text += text
        if finish:
            self.finish_reason = finish
        if usage is not None:
            self.usage = usage
        if not (text or finish or usage):
            return None  # role-only or empty keep-alive chunk
        return ChatDelta(text, finish, usage, self.tok_s, self.ttft)

    def cancel(self) -> None:
        """Abort from any thread: shut the socket down so a blocked read returns at once."""
        self._cancelled.set()
        stream = self._response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Close the response (the server aborts the sequence). Call it from the iterating thread."""
        if not self._closed:
            self._closed = True
            self._response.close()

    def __enter__(self) -> ChatStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


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
        self._default_model: str | None = None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plain requests ----
    def _request(self, method: str, path: str, json_body: Any = None, timeout: Any = None) -> httpx.Response:
        kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        try:
            response = self._http.request(method, path, json=json_body, **kwargs)
        except httpx.HTTPError as e:
            raise EngineClientError(f"cannot reach the server at {self.base_url}: {_describe(e)}") from e
        if response.status_code >= 400:
            raise _error_from_response(response)
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
            raise EngineClientError(f"cannot reach the server at {self.base_url}: {_describe(e)}") from e
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
            message = _error_message(body) or "loading"
            return {"status": "loading", "message": message}
        if response.status_code >= 400:
            raise _error_from_response(response)
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
        self._default_model = None
        return self._json("POST", "/v1/engine/load", {"model": model_id}, timeout=LOAD_TIMEOUT)

    def unload_model(self) -> dict:
        self._default_model = None
        return self._json("POST", "/v1/engine/unload", {}, timeout=LOAD_TIMEOUT)

    # ---- generation ----
    def _body(self, messages: list[dict], model: str | None, sampling: dict[str, Any]) -> dict:
        model = model or self._model()
        body = {"messages": messages, **{k: v for k, v in sampling.items() if v is not None}}
        if model:
            body["model"] = model
        return body

    def _model(self) -> str | None:
        """Servers other than Ember's need a model name: the first one they list."""
        if self._default_model is None:
            try:
                models = self.models()
            except EngineClientError:
                return None
            self._default_model = models[0]["id"] if models else None
        return self._default_model

    def chat_stream(self, messages: list[dict], model: str | None = None, *, include_usage: bool = True,
                    **sampling: Any) -> ChatStream:
        """Start a streamed chat completion; sampling keywords (temperature, top_p, max_tokens, stop,
        seed, ...) go into the request body as they are. Raises EngineClientError for a refused request."""
        body = self._body(messages, model, sampling) | {"stream": True}
        if include_usage:
            body["stream_options"] = {"include_usage": True}
        request = self._http.build_request("POST", "/v1/chat/completions", json=body, timeout=STREAM_TIMEOUT)
        t_sent = time.perf_counter()
        try:
            response = self._http.send(request, stream=True)
        except httpx.HTTPError as e:
            raise EngineClientError(f"cannot reach the server at {self.base_url}: {_describe(e)}") from e
        if response.status_code >= 400:
            try:
                response.read()
            finally:
                response.close()
            raise _error_from_response(response)
        return ChatStream(response, t_sent)

    def chat(self, messages: list[dict], model: str | None = None, **sampling: Any) -> ChatDelta:
        """A whole reply in one request (no streaming): its text, finish reason and usage."""
        body = self._body(messages, model, sampling) | {"stream": False}
        t_sent = time.perf_counter()
        reply = self._json("POST", "/v1/chat/completions", body, timeout=STREAM_TIMEOUT)
        try:
            choice = reply["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError):
            raise EngineClientError("the server's chat completion has no choices") from None
        return ChatDelta(text, choice.get("finish_reason"), _usage(reply.get("usage")),
                         None, time.perf_counter() - t_sent)


# ---- helpers ----

def _sse_events(lines: Iterator[str]) -> Iterator[str]:
    """Server-sent events: `data:` lines joined until a blank line; comments and other fields skipped."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    try:
        details = raw.get("prompt_tokens_details") or {}
        prompt, completion = int(raw.get("prompt_tokens") or 0), int(raw.get("completion_tokens") or 0)
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return Usage(prompt, completion, int(raw.get("total_tokens") or prompt + completion),
                     None if cached is None else int(cached))
    except (TypeError, ValueError):
        return None


def _error_message(body: Any) -> str | None:
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(error, str):
        return error
    detail = body.get("detail")  # FastAPI's default shape
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        return str(detail[0].get("msg"))
    return body.get("message") if isinstance(body.get("message"), str) else None


def _error_from_body(body: Any, status: int | None) -> EngineClientError:
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {}
    message = _error_message(body) or f"HTTP {status}"
    return EngineClientError(message, status, error.get("type"), error.get("code"))


def _error_from_response(response: httpx.Response) -> EngineClientError:
    try:
        body = json.loads(response.content[:MAX_ERROR_BODY])
    except ValueError:
        text = response.content[:300].decode("utf-8", errors="replace").strip()
        return EngineClientError(f"HTTP {response.status_code}: {text or response.reason_phrase}",
                                 response.status_code)
    return _error_from_body(body, response.status_code)


def _describe(e: BaseException) -> str:
    return str(e) or type(e).__name__
