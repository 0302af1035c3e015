"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens), so that programs speaking
it (Claude Code, the `anthropic` client) work against Ember, as llama.cpp's server, Ollama and
LM Studio serve it.

No second engine path: a request becomes a ChatCompletionRequest (protocol.py) and goes
through engine.server.chat.start_chat (model, template, tools, grammar, context, sampler, turn stops).
The reply is one `message` object, or Anthropic's SSE events (message_start, ping, per content
block start/delta/stop, message_delta, message_stop). Errors are Anthropic's shape,
{"type": "error", "error": {"type", "message"}}; the middleware's refusals (key, Host, Origin)
stay OpenAI's. The key may come as `x-api-key` (engine/server/auth.py).

max_tokens larger than what the context has room for is clamped to that room (stop_reason
max_tokens when it fills): agents send their own large default, not the local model's context.
"""
from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.server.anthropic.protocol import (CountTokensRequest, MessagesRequest, openai_messages,
                                              openai_tools, sampler_fields)
from engine.server.chat import ChatRun, render_prompt, start_chat
from engine.server.chat_images import encode_chat
from engine.server.errors import APIError, shaped_route, validated
from engine.server.openai.protocol import ChatCompletionRequest
from engine.server.model_use import use_model
from engine.server.sse import SSE_HEADERS
from engine.server.structured import reply_shape

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def _error_body(status: int, message: str) -> dict:
    kind = _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


# Errors in Anthropic's shape, which the `anthropic` client reads.
AnthropicRoute = shaped_route(lambda status, message: JSONResponse(_error_body(status, message), status_code=status))


def _chat_request(body: CountTokensRequest, **sampler) -> ChatCompletionRequest:
    data = {"model": body.model, "messages": openai_messages(body), **openai_tools(body), **sampler}
    return validated(ChatCompletionRequest, data)


async def _start(request: Request, req: ChatCompletionRequest) -> ChatRun:
    try:
        return await start_chat(request, req, "msg")
    except APIError as e:
        if e.code != "context_length_exceeded" or e.param != "max_tokens":
            raise
    # the prompt fits but max_tokens does not: until the context is full (less than max_tokens)
    return await start_chat(request, req.model_copy(update={"max_tokens": None}), "msg")


def _input(arguments: str) -> dict:
    try:
        v = json.loads(arguments)
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


def _event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


class _Reply:
    """One ChatRun's reply as Anthropic's message, or its stream of events."""

    def __init__(self, run: ChatRun, stops: list[str]) -> None:
        self.run, self.stops = run, stops
        self.choice = run.choices[0]
        self.last = None  # the last RequestOutput
        self.block = -1  # the index of the last content block started
        self.text_open = False
        self.thinking_open = False

    def add(self, out) -> None:
        self.last = out
        self.choice.add(out)

    def stop_sequence(self) -> str | None:
        """Which of the request's stop sequences ended the reply: the engine drops the matched
        text, so it is found in the decoded tokens after the reply's text (a reply that ended
        on an end-of-turn token, or on the template's own turn stop, matched none)."""
        out = self.last
        if out is None or out.finish_reason != "stop" or not self.stops or not out.output_token_ids:
            return None
        tokenizer = self.run.engine.tokenizer
        if out.output_token_ids[-1] in tokenizer.stop_ids:
            return None
        rest = tokenizer.decode(out.output_token_ids)[max(0, len(out.text) - 1):]
        found = [(rest.find(s), s) for s in self.stops if s in rest]
        return min(found)[1] if found else None

    def stop_reason(self, stop_sequence: str | None) -> str:
        reason = self.choice.reason
        if reason == "tool_calls":
            return "tool_use"
        if reason == "length":
            return "max_tokens"
        return "stop_sequence" if stop_sequence is not None else "end_turn"

    def usage(self) -> dict:
        return {"input_tokens": len(self.run.prompt_ids), "output_tokens": self.choice.completion_tokens}

    def message(self) -> dict:
        c = self.choice
        content = [{"type": "thinking", "thinking": c.reasoning, "signature": ""}] if c.reasoning else []
        content += [{"type": "text", "text": c.content}] if c.content else []
        content += [{"type": "tool_use", "id": t.id, "name": t.name, "input": _input(t.arguments)} for t in c.calls]
        seq = self.stop_sequence()
        return {"id": self.run.rid, "type": "message", "role": "assistant", "model": self.run.model,
                "content": content, "stop_reason": self.stop_reason(seq), "stop_sequence": seq,
                "usage": self.usage()}

    # ---- streaming --------------------------------------------------------------------------------
    def _start_block(self, block: dict) -> str:
        self.block += 1
        return _event("content_block_start", {"type": "content_block_start", "index": self.block,
                                              "content_block": block})

    def _stop_text(self):
        if self.text_open or self.thinking_open:
            self.text_open = self.thinking_open = False
            yield _event("content_block_stop", {"type": "content_block_stop", "index": self.block})

    def events(self, out):
        """The events for what `out` added (text that may begin a tool call is held back until
        the reply ends and is parsed, as the OpenAI chat stream does)."""
        self.add(out)
        for delta, _reason, _items in self.choice.stream_deltas(out, None, False):
            if delta.get("reasoning_content"):  # a thinking block, before the text (no signature: local)
                if not self.thinking_open:
                    self.thinking_open = True
                    yield self._start_block({"type": "thinking", "thinking": "", "signature": ""})
                yield _event("content_block_delta", {"type": "content_block_delta", "index": self.block, "delta": {
                    "type": "thinking_delta", "thinking": delta["reasoning_content"]}})
            if delta.get("content"):
                if self.thinking_open:
                    yield from self._stop_text()
                if not self.text_open:
                    self.text_open = True
                    yield self._start_block({"type": "text", "text": ""})
                yield _event("content_block_delta", {"type": "content_block_delta", "index": self.block,
                                                     "delta": {"type": "text_delta", "text": delta["content"]}})
            if delta.get("tool_calls"):
                yield from self._stop_text()
                for call in self.choice.calls:
                    yield self._start_block({"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
                    yield _event("content_block_delta", {"type": "content_block_delta", "index": self.block, "delta": {
                        "type": "input_json_delta", "partial_json": json.dumps(_input(call.arguments))}})
                    yield _event("content_block_stop", {"type": "content_block_stop", "index": self.block})

    def head(self) -> str:
        message = {"id": self.run.rid, "type": "message", "role": "assistant", "model": self.run.model,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": len(self.run.prompt_ids), "output_tokens": 0}}
        return (_event("message_start", {"type": "message_start", "message": message})
                + _event("ping", {"type": "ping"}))

    def tail(self):
        yield from self._stop_text()
        seq = self.stop_sequence()
        yield _event("message_delta", {"type": "message_delta", "usage": self.usage(), "delta": {
            "stop_reason": self.stop_reason(seq), "stop_sequence": seq}})
        yield _event("message_stop", {"type": "message_stop"})

    async def stream(self):
        """The SSE events; an engine failure mid-stream is an `error` event, as Anthropic sends it."""
        job = self.run.job
        try:
            yield self.head()
            async for _rid, out in job:
                for e in self.events(out):
                    yield e
        except APIError as e:
            yield _event("error", _error_body(e.status, e.message))
            return
        else:
            for e in self.tail():
                yield e
        finally:
            job.close()

    async def collect(self) -> dict:
        job = self.run.job
        try:
            async for _rid, out in job:
                self.add(out)
        finally:
            job.close()
        return self.message()


def build_anthropic_router() -> APIRouter:
    router = APIRouter(route_class=AnthropicRoute)

    @router.post("/v1/messages")
    async def messages(body: MessagesRequest, request: Request):
        run = await _start(request, _chat_request(body, **sampler_fields(body)))
        reply = _Reply(run, body.stop_sequences or [])
        if body.stream:
            return StreamingResponse(reply.stream(), media_type="text/event-stream", headers=SSE_HEADERS)
        return JSONResponse(await reply.collect())

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountTokensRequest, request: Request):
        """The rendered prompt's tokens, as /v1/messages counts them, each image's tokens too
        (tool_choice changes only the grammar, not the prompt, so it is not compiled here)."""
        state = request.app.state
        req = _chat_request(body)
        engine = (await use_model(request, req.model)).engine
        shape = await reply_shape(engine, req.model_copy(update={"tool_choice": None}))
        ids, _ = await encode_chat(engine, req, render_prompt(engine, req, shape), state.settings.fetch_image_urls)
        return {"input_tokens": len(ids)}

    return router
