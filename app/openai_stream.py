"""The OpenAI wire format, client side: server-sent events, stream chunks -> ChatDelta, error bodies.

Timing is measured here, on the client, so the figures mean the same thing against Ember's
engine, vLLM, llama.cpp's server or Ollama: ttft from sending the request to the first text,
tok/s over the tokens after the first.
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

from app.doc_sources import Source, parse_sources

log = logging.getLogger(__name__)

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
class ToolCall:
    """A function call the model made, as the server parsed it (a choice's `tool_calls`)."""

    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


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
    reasoning: str = ""  # a reasoning model's thinking (delta.reasoning_content), apart from the answer
    tool_calls: tuple[ToolCall, ...] = ()  # every call so far, on the deltas that add to them
    sources: tuple[Source, ...] = ()  # the passages a documents reply was given (on its first delta)


class ChatStream(Iterator[ChatDelta]):
    """An open streaming response; iterate for deltas. `close()` (or `cancel()` from another thread) aborts it."""

    def __init__(self, response: httpx.Response, t_sent: float) -> None:
        self._response = response
        self._events = sse_events(response.iter_lines())
        self._t_sent = t_sent
        self._t_first: float | None = None
        self._t_last: float | None = None
        self._chunks = 0  # chunks that carried text: one token each on most servers
        self._cancelled = threading.Event()
        self._closed = False
        self.text = ""
        self.reasoning = ""
        self.calls: dict[int, dict] = {}  # the tool calls streamed so far, by index (fragments joined)
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.id: str | None = None
        self.model: str | None = None
        self.sources: tuple[Source, ...] = ()  # Ember's documents extension: on the first chunk

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
                raise EngineClientError(f"the connection to the server was lost mid-reply ({describe(e)})") from e
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
            raise error_from_body(chunk, None)
        self.id = self.id or chunk.get("id")
        self.model = self.model or chunk.get("model")
        sources = parse_sources(chunk.get("sources")) if "sources" in chunk else ()
        self.sources = sources or self.sources
        text, thought, finish, calls = "", "", None, ()
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text, thought = delta.get("content") or "", delta.get("reasoning_content") or ""
            finish = choice.get("finish_reason")
            if delta.get("tool_calls"):
                calls = self._add_calls(delta["tool_calls"])
        usage = parse_usage(chunk.get("usage"))
        now = time.perf_counter()
        self.reasoning += thought
        if text or thought:
            self._t_first = self._t_first or now
            self._t_last = now
            self._chunks += 1
            self.text += text
        if finish:
            self.finish_reason = finish
        if usage is not None:
            self.usage = usage
        if not (text or thought or finish or usage or calls or sources):
            return None  # role-only or empty keep-alive chunk
        return ChatDelta(text, finish, usage, self.tok_s, self.ttft, thought, calls, sources)

    def _add_calls(self, parts: Any) -> tuple[ToolCall, ...]:
        """OpenAI's streamed tool calls: each part names its call's index; the id and name come
        once, the arguments in pieces to join. Every call so far, whole."""
        for part in parts if isinstance(parts, list) else ():
            if not isinstance(part, dict):
                continue
            call = self.calls.setdefault(part.get("index", len(self.calls)), {"id": "", "name": "", "arguments": ""})
            function = part.get("function") or {}
            call["id"] = part.get("id") or call["id"]
            call["name"] = function.get("name") or call["name"]
            call["arguments"] += function.get("arguments") or ""
        return tuple(ToolCall(c["id"], c["name"], c["arguments"]) for _, c in sorted(self.calls.items()))

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


def sse_events(lines: Iterator[str]) -> Iterator[str]:
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


def parse_usage(raw: Any) -> Usage | None:
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


def error_message(body: Any) -> str | None:
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


def error_from_body(body: Any, status: int | None) -> EngineClientError:
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {}
    message = error_message(body) or f"HTTP {status}"
    return EngineClientError(message, status, error.get("type"), error.get("code"))


def error_from_response(response: httpx.Response) -> EngineClientError:
    try:
        body = json.loads(response.content[:MAX_ERROR_BODY])
    except ValueError:
        text = response.content[:300].decode("utf-8", errors="replace").strip()
        return EngineClientError(f"HTTP {response.status_code}: {text or response.reason_phrase}",
                                 response.status_code)
    return error_from_body(body, response.status_code)


def describe(e: BaseException) -> str:
    return str(e) or type(e).__name__
