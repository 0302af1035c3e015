"""Ollama's native API, so that programs speaking Ollama (Open WebUI, Continue, the `ollama`
client) work against Ember: /api/chat, /api/generate, /api/embed and /api/embeddings here;
/api/tags, /api/show, /api/ps, /api/version and /api/pull in model_routes.py. Embeddings
are engine/server/embeddings.py's, as on /v1/embeddings.

No second engine path: a chat (and a templated generate) becomes a ChatCompletionRequest and goes
through engine.server.chat.start_chat (model, template, tools, grammar, context, sampler, turn stops);
a raw generate is the same steps without the template. Replies are NDJSON lines (streamed, the
default) or one object, the last with Ollama's counts and durations (nanoseconds). Errors are
Ollama's shape, {"error": "..."}; the middleware's refusals (key, Host, Origin) stay OpenAI's.

Model names: Ollama's `name:tag`; `:latest` is stripped to find the installed id. A model not
loaded is loaded just in time beside the others (engine/server/model_use.py); `keep_alive` says how
long it stays once idle, and an empty request with `keep_alive: 0` unloads it, as in Ollama.
"""
from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timezone

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.keep_alive import parse_keep_alive
from engine.server.chat import ChatChoice, ChatRun, start_chat
from engine.server.errors import APIError, shaped_route, validated
from engine.server.ollama.embeddings import (OllamaEmbeddingsRequest, OllamaEmbedRequest, ollama_embed_reply,
                                             ollama_embeddings_reply)
from engine.server.model_use import resolve, use_model
from engine.server.ollama.models import tag
from engine.server.ollama.protocol import ChatRequest, Format, GenerateRequest, Message, openai_content
from engine.server.openai import bodies as R
from engine.server.openai.protocol import ChatCompletionRequest, SamplingRequest
from engine.server.serving import Job, encode, fit_context, sampling_params
from engine.server.structured import response_format_grammar
from engine.server.tool_protocol import ResponseFormat
from engine.service.handle import KEEP_DEFAULT
from engine.service.served_model import LoadedModel, ModelSpec

NDJSON = "application/x-ndjson"


# Errors in Ollama's shape, {"error": message}, which the `ollama` client reads.
OllamaRoute = shaped_route(lambda status, message: ollama_error(status, message))


def ollama_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def ollama_not_found(name: str) -> APIError:
    return APIError(404, f"model '{name}' not found")


def keep_alive_of(value) -> float | None | object:
    """A request's keep_alive in seconds (None: forever); absent, the server's setting."""
    if value is None:
        return KEEP_DEFAULT
    try:
        return parse_keep_alive(value)
    except ValueError as e:
        raise APIError(400, str(e)) from None


async def _loaded(request: Request, name: str, text: bool = True, keep_alive=None) -> LoadedModel:
    try:
        return await use_model(request, name, text, keep_alive_of(keep_alive))
    except APIError as e:
        raise (ollama_not_found(name) if e.status == 404 else e) from None


# ---- requests -> the chat path ---------------------------------------------------------------
def _response_format(fmt: Format) -> dict | None:
    if not fmt:
        return None
    if fmt == "json":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}


def _openai_messages(messages: list[Message]) -> list[dict]:
    """Ollama's messages in OpenAI's shape: tool calls get ids, and each tool result answers the
    earliest open call of its tool_name (or the earliest open call)."""
    out, open_calls = [], []
    for i, m in enumerate(messages):
        d = {"role": m.role, "content": openai_content(m.content, m.images)}  # images: content[k]
        if m.tool_calls:
            d["tool_calls"] = []
            for j, c in enumerate(m.tool_calls):
                cid = f"call_{i}_{j}"
                open_calls.append((cid, c.function.name))
                d["tool_calls"].append({"id": cid, "type": "function", "function": {
                    "name": c.function.name, "arguments": json.dumps(c.function.arguments)}})
        if m.role == "tool":
            match = next((c for c in open_calls if c[1] == m.tool_name), open_calls[0] if open_calls else None)
            if match is None:
                raise APIError(400, f"messages.{i}: a tool result answers no earlier tool call")
            open_calls.remove(match)
            d["tool_call_id"] = match[0]
            if m.tool_name:
                d["name"] = m.tool_name
        out.append(d)
    return out


async def _start_raw(request: Request, loaded: LoadedModel, prompt: str, sampler: dict, fmt: Format) -> ChatRun:
    """A raw generate: the prompt as it is, the rest as start_chat does it."""
    engine = loaded.engine
    sreq = validated(SamplingRequest, {"model": loaded.spec.id, **sampler})
    rf = _response_format(fmt)
    grammar = await response_format_grammar(engine, ResponseFormat.model_validate(rf) if rf else None, "format")
    ids = await encode(engine, prompt)
    if sreq.max_tokens == 0:
        raise APIError(400, "num_predict must be at least 1 (or -1: no limit)")
    ids, max_tokens = fit_context(ids, sreq.max_tokens, None, engine.max_model_len, what="prompt")
    params = sampling_params(sreq, max_tokens, engine.tokenizer.vocab_size, None, grammar=grammar)
    rid = R.new_id("ollama")
    job = Job(request.app.state.engine_thread, request)
    job.submit(ids, params, f"{rid}-0", engine)
    await job.first()
    return ChatRun(engine, loaded.spec.id, rid, ids, job, {f"{rid}-0": 0}, [ChatChoice(0, None)])


# ---- replies ---------------------------------------------------------------------------------
class _Reply:
    """One ChatRun's reply as Ollama's chunks: `message` (chat) or `response` (generate)."""

    def __init__(self, run: ChatRun, chat: bool, t0: float) -> None:
        self.run, self.chat, self.t0 = run, chat, t0
        self.choice = run.choices[0]

    def chunk(self, text: str, calls=None, thinking: str = "") -> dict:
        """A reasoning model's thoughts go in `thinking` (message.thinking in a chat), as Ollama's."""
        d = {"model": tag(self.run.model), "created_at": _now()}
        if self.chat:
            d["message"] = {"role": "assistant", "content": text} | ({"thinking": thinking} if thinking else {})
            if calls:
                d["message"]["tool_calls"] = [{"function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                                              for c in calls]
        else:
            d["response"] = text
            if thinking:
                d["thinking"] = thinking
        return d | {"done": False}

    def feed(self, out):
        """The chunks for what `out` added (tool-call text is held back until it is parsed)."""
        self.choice.add(out)
        for delta, _reason, _items in self.choice.stream_deltas(out, None, False):
            if delta.get("reasoning_content"):
                yield self.chunk("", thinking=delta["reasoning_content"])
            if delta.get("content"):
                yield self.chunk(delta["content"])
            if delta.get("tool_calls"):
                yield self.chunk("", self.choice.calls)

    def final(self, text: str = "", calls=None, thinking: str = "") -> dict:
        end = time.monotonic()
        job, c = self.run.job, self.choice
        first = job.first_token_at.get(next(iter(self.run.index)), end)
        ns = lambda s: max(0, int(s * 1e9))  # noqa: E731
        return self.chunk(text, calls, thinking) | {
            "done": True, "done_reason": "length" if c.reason == "length" else "stop",
            "total_duration": ns(end - self.t0), "load_duration": 0,  # the model was loaded already
            "prompt_eval_count": len(self.run.prompt_ids), "prompt_eval_duration": ns(first - job.t0),
            "eval_count": c.completion_tokens, "eval_duration": ns(end - first)}

    async def lines(self):
        """NDJSON; an engine failure mid-stream is an {"error"} line, as Ollama sends it."""
        job = self.run.job
        try:
            async for _rid, out in job:
                for chunk in self.feed(out):
                    yield _line(chunk)
        except APIError as e:
            yield _line({"error": e.message})
            return
        else:
            yield _line(self.final())
        finally:
            job.close()

    async def respond(self, stream: bool):
        if stream:
            return StreamingResponse(self.lines(), media_type=NDJSON)
        await self.run.collect()
        c = self.choice
        return JSONResponse(self.final(c.content or "", c.calls, c.reasoning) if self.chat
                            else self.final(c.text, thinking=c.reasoning))


def _arguments(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def _line(d: dict) -> str:
    return json.dumps(d, ensure_ascii=False, separators=(",", ":")) + "\n"


def _loaded_reply(model_id: str, chat: bool, reason: str = "load") -> dict:
    """An empty request is Ollama's way to load a model (or, with keep_alive 0, to unload it)."""
    d = {"model": tag(model_id), "created_at": _now()}
    d |= {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return d | {"done": True, "done_reason": reason}


def ollama_spec(state, name: str) -> ModelSpec:
    """The model an Ollama name means (model_use.resolve), or Ollama's own "not found"."""
    try:
        return resolve(state.engine_thread, state.model_store, state.settings.default_model, name)
    except APIError as e:
        raise (ollama_not_found(name) if e.status == 404 else e) from None


async def _unload(request: Request, name: str, chat: bool) -> dict:
    """`ollama stop`: an empty request with keep_alive 0 unloads the model (once its replies end)."""
    state = request.app.state
    spec = ollama_spec(state, name)
    await asyncio.wrap_future(state.engine_thread.unload(spec.id))
    return _loaded_reply(spec.id, chat, "unload")


async def _embed(request: Request, loaded, inputs: list, truncate: bool = False):
    state = request.app.state
    return await state.embeddings.run(state.engine_thread, loaded, inputs, truncate, request=request)


def build_ollama_router() -> APIRouter:
    router = APIRouter(route_class=OllamaRoute)

    @router.post("/api/chat")
    async def chat(body: ChatRequest, request: Request):
        t0 = time.monotonic()
        if not body.messages and keep_alive_of(body.keep_alive) == 0:
            return await _unload(request, body.model, chat=True)
        loaded = await _loaded(request, body.model, keep_alive=body.keep_alive)
        if not body.messages:
            return _loaded_reply(loaded.spec.id, chat=True)
        req = validated(ChatCompletionRequest, {
            "model": loaded.spec.id, "messages": _openai_messages(body.messages), "tools": body.tools,
            "response_format": _response_format(body.format), **body.options.sampler_fields(),
            **body.think_fields()})
        run = await start_chat(request, req, "ollama")
        return await _Reply(run, True, t0).respond(body.stream)

    @router.post("/api/generate")
    async def generate(body: GenerateRequest, request: Request):
        t0 = time.monotonic()
        if body.images and body.raw:
            raise APIError(400, "images: a raw prompt has no place for images; send them without raw")
        for field in ("suffix", "template", "context"):
            if getattr(body, field):
                raise APIError(400, f"{field} is not supported by Ember's /api/generate"
                               + ("; send the conversation to /api/chat" if field == "context" else ""))
        if not body.prompt and keep_alive_of(body.keep_alive) == 0:
            return await _unload(request, body.model, chat=False)
        loaded = await _loaded(request, body.model, text=False, keep_alive=body.keep_alive)
        if not body.prompt:
            return _loaded_reply(loaded.spec.id, chat=False)
        sampler = body.options.sampler_fields()
        if body.raw:
            run = await _start_raw(request, loaded, body.prompt, sampler, body.format)
        else:
            messages = ([{"role": "system", "content": body.system}] if body.system else []) + [
                {"role": "user", "content": openai_content(body.prompt, body.images)}]
            req = validated(ChatCompletionRequest, {"model": loaded.spec.id, "messages": messages,
                                                     "response_format": _response_format(body.format), **sampler,
                                                     **body.think_fields()})
            run = await start_chat(request, req, "ollama")
        return await _Reply(run, False, t0).respond(body.stream)

    @router.post("/api/embed")
    async def embed(body: OllamaEmbedRequest, request: Request):
        t0 = time.monotonic()
        loaded = await _loaded(request, body.model, text=False, keep_alive=body.keep_alive)
        inputs = [body.input] if isinstance(body.input, str) else body.input
        res = await _embed(request, loaded, inputs, body.truncate)
        return ollama_embed_reply(body.model, res, body.dimensions, t0)

    @router.post("/api/embeddings")
    async def embeddings(body: OllamaEmbeddingsRequest, request: Request):
        loaded = await _loaded(request, body.model, text=False)
        if not body.prompt:  # as Ollama: no text, no vector
            return {"embedding": []}
        return ollama_embeddings_reply(await _embed(request, loaded, [body.prompt]))

    return router
