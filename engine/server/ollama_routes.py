"""Ollama's native API (/api/chat, /api/generate, /api/embed, /api/embeddings, /api/tags, /api/show,
/api/ps, /api/version), so that programs speaking Ollama (Open WebUI, Continue, the `ollama`
client) work against Ember. Embeddings are embeddings.py's, as on /v1/embeddings.

No second engine path: a chat (and a templated generate) becomes a ChatCompletionRequest and goes
through chat_routes.start_chat (model, template, tools, grammar, context, sampler, turn stops);
a raw generate is the same steps without the template. Replies are NDJSON lines (streamed, the
default) or one object, the last with Ollama's counts and durations (nanoseconds). Errors are
Ollama's shape, {"error": "..."}; the middleware's refusals (key, Host, Origin) stay OpenAI's.

Model names: Ollama's `name:tag`; `:latest` is stripped to find the installed id. As on /v1,
only the loaded model answers (an installed one is a 400 saying to load it): a client does not
switch the model the app is using. keep_alive is accepted and ignored for the same reason.
"""
from __future__ import annotations

import hashlib
import json
import time
from datetime import datetime, timezone
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from engine.model_files.gguf_file import GGUFFile
from engine.model_files.manifest import is_model_id, manifest_path, read_manifest
from engine.model_files.meta import read_meta
from engine.model_files.tool_call_syntax import tool_format
from engine.server import responses as R
from engine.server.chat_routes import ChatChoice, ChatRun, start_chat
from engine.server.embedding_routes import (OllamaEmbeddingsRequest, OllamaEmbedRequest, ollama_embed_reply,
                                            ollama_embeddings_reply)
from engine.server.engine_thread import LoadedModel, ModelSpec
from engine.server.errors import APIError, _validation_message, shaped_route
from engine.server.ollama_protocol import ChatRequest, Format, GenerateRequest, Message, ShowRequest
from engine.server.protocol import ChatCompletionRequest, SamplingRequest
from engine.server.serving import Job, encode, fit_context, require_model, sampling_params
from engine.server.structured import response_format_grammar
from engine.server.tool_protocol import ResponseFormat

NDJSON = "application/x-ndjson"


# Errors in Ollama's shape, {"error": message}, which the `ollama` client reads.
OllamaRoute = shaped_route(lambda status, message: _error(status, message))


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _validated(cls, data: dict):
    """A request model built here from a translated request; its refusals are 400s."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise APIError(400, _validation_message(RequestValidationError(e.errors()))[0]) from None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _model_id(name: str) -> str:
    return name.removesuffix(":latest")


def _tag(model_id: str) -> str:
    return f"{model_id}:latest"


def _not_found(name: str) -> APIError:
    return APIError(404, f"model '{name}' not found")


def _loaded(request: Request, name: str) -> LoadedModel:
    state = request.app.state
    try:
        return require_model(state.engine_thread, state.model_store, _model_id(name))
    except APIError as e:
        raise (_not_found(name) if e.status == 404 else e) from None


# ---- model facts (tags, show, ps) ------------------------------------------------------------
_digests: dict[tuple, str] = {}  # (path, size, mtime_ns) -> sha256, for models outside the store


def _sha256(path: Path) -> str:
    """The store's digest rule (manifest.py): a file's sha256; a directory's sorted
    "relpath\\0sha256\\n" lines hashed."""
    if path.is_dir():
        lines = "".join(f"{p.relative_to(path).as_posix()}\0{_sha256(p)}\n"
                        for p in sorted(path.rglob("*")) if p.is_file())
        return hashlib.sha256(lines.encode()).hexdigest()
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _digests:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        _digests[key] = h.hexdigest()
    return _digests[key]


def _facts(store, spec: ModelSpec) -> dict:
    """The manifest's fields for a model (read from the file for one served by --model PATH)."""
    if store.root is not None and is_model_id(spec.id):
        p = manifest_path(store.root, spec.id)
        if p.is_file():
            return read_manifest(p)
    path = Path(spec.path)
    meta = read_meta(path)
    size = (sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir()
            else path.stat().st_size)
    added = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).isoformat()
    return {"format": meta.format, "architecture": meta.architecture, "parameter_count": meta.parameter_count,
            "quantization": meta.quantization, "context_length": meta.context_length,
            "num_layers": meta.num_layers, "num_kv_heads": meta.num_kv_heads, "size_bytes": size,
            "sha256": _sha256(path), "added_at": added, "path": str(path)}


def _parameter_size(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{unit}" if unit == "B" else f"{n / div:.0f}{unit}"
    return str(n)


def _details(f: dict) -> dict:
    arch = f.get("architecture") or ""
    return {"parent_model": "", "format": f.get("format", "gguf"), "family": arch, "families": [arch],
            "parameter_size": _parameter_size(int(f.get("parameter_count") or 0)),
            "quantization_level": f.get("quantization") or ""}


def _listing(spec: ModelSpec, f: dict) -> dict:
    return {"name": _tag(spec.id), "model": _tag(spec.id), "modified_at": f.get("added_at"),
            "size": f.get("size_bytes", 0), "digest": f.get("sha256", ""), "details": _details(f)}


def _template_of(spec: ModelSpec, loaded: LoadedModel | None) -> str:
    if loaded is not None and loaded.spec.id == spec.id:
        return loaded.engine.chat_template.source
    path = Path(spec.path)
    if path.is_file():
        with GGUFFile(path) as header:
            t = header.get("tokenizer.chat_template")
        return t if isinstance(t, str) else ""
    config = path / "tokenizer_config.json"
    if config.is_file():
        t = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
        return t if isinstance(t, str) else ""
    return ""


def _show(store, spec: ModelSpec, loaded: LoadedModel | None) -> dict:
    f = _facts(store, spec)
    arch = f.get("architecture") or "unknown"
    info = {"general.architecture": arch, "general.parameter_count": f.get("parameter_count"),
            "general.name": spec.name or spec.id}
    if f.get("context_length"):
        info[f"{arch}.context_length"] = f["context_length"]
    if f.get("num_layers"):
        info[f"{arch}.block_count"] = f["num_layers"]
    if f.get("num_kv_heads"):
        info[f"{arch}.attention.head_count_kv"] = f["num_kv_heads"]
    template = _template_of(spec, loaded)
    parameters = ""
    if loaded is not None and loaded.spec.id == spec.id:  # what this server serves it with
        parameters = f"num_ctx {loaded.engine.max_model_len}"
        stops = loaded.engine.chat_template.turn_stops
        parameters += "".join(f"\nstop {json.dumps(s)}" for s in stops)
    caps = ["completion"] + (["tools"] if tool_format(template) is not None else [])
    return {"modelfile": "", "parameters": parameters, "template": template, "details": _details(f),
            "model_info": info, "capabilities": caps, "modified_at": f.get("added_at")}


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
        if m.images:
            raise APIError(400, f"messages.{i}.images: this model takes no images (Ember serves text models)")
        d = {"role": m.role, "content": m.content}
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
    sreq = _validated(SamplingRequest, {"model": loaded.spec.id, **sampler})
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
    first = await job.first()
    return ChatRun(engine, loaded.spec.id, rid, ids, job, first, {f"{rid}-0": 0}, [ChatChoice(0, None)])


# ---- replies ---------------------------------------------------------------------------------
class _Reply:
    """One ChatRun's reply as Ollama's chunks: `message` (chat) or `response` (generate)."""

    def __init__(self, run: ChatRun, chat: bool, t0: float) -> None:
        self.run, self.chat, self.t0 = run, chat, t0
        self.choice = run.choices[0]

    def chunk(self, text: str, calls=None, thinking: str = "") -> dict:
        """A reasoning model's thoughts go in `thinking` (message.thinking in a chat), as Ollama's."""
        d = {"model": _tag(self.run.model), "created_at": _now()}
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
            item = self.run.first
            while True:
                for chunk in self.feed(item[1]):
                    yield _line(chunk)
                if not job.unfinished:
                    break
                try:
                    item = await job.next()
                except APIError as e:
                    yield _line({"error": e.message})
                    return
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


def _loaded_reply(loaded: LoadedModel, chat: bool) -> dict:
    """An empty request is Ollama's way to load a model: it is loaded (or require_model said why not)."""
    d = {"model": _tag(loaded.spec.id), "created_at": _now()}
    d |= {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return d | {"done": True, "done_reason": "load"}


def build_ollama_router() -> APIRouter:
    router = APIRouter(route_class=OllamaRoute)

    @router.get("/api/version")
    async def version():
        from importlib.metadata import PackageNotFoundError, version as dist_version
        try:
            return {"version": dist_version("ember")}
        except PackageNotFoundError:
            return {"version": "0.0.0"}

    @router.get("/api/tags")
    async def tags(request: Request):
        state = request.app.state
        loaded = state.engine_thread.model
        specs, seen = ([loaded.spec] if loaded else []) + state.model_store.list(), set()
        models = []
        for spec in specs:
            if spec.id in seen:
                continue
            seen.add(spec.id)
            try:
                models.append(_listing(spec, await run_in_threadpool(_facts, state.model_store, spec)))
            except (OSError, ValueError):  # a file gone or damaged since it was installed
                continue
        return {"models": models}

    @router.post("/api/show")
    async def show(body: ShowRequest, request: Request):
        state = request.app.state
        name = body.model or body.name
        if not name:
            raise APIError(400, "model is required")
        mid, loaded = _model_id(name), state.engine_thread.model
        if loaded is not None and mid in (loaded.spec.id, loaded.spec.name, Path(loaded.spec.path).name):
            spec = loaded.spec
        elif state.model_store.exists(mid):
            try:
                spec = state.model_store.get(mid)
            except (OSError, ValueError) as e:
                raise APIError(400, f"the manifest of {mid!r} is unusable: {e}") from None
        else:
            raise _not_found(name)
        try:
            return await run_in_threadpool(_show, state.model_store, spec, loaded)
        except (OSError, ValueError) as e:
            raise APIError(400, f"cannot read {name!r}: {e}") from None

    @router.get("/api/ps")
    async def ps(request: Request):
        state = request.app.state
        loaded = state.engine_thread.model
        if loaded is None:
            return {"models": []}
        entry = _listing(loaded.spec, await run_in_threadpool(_facts, state.model_store, loaded.spec))
        on_gpu = not str(loaded.device).startswith("cpu")
        return {"models": [entry | {"size_vram": entry["size"] if on_gpu else 0,
                                    "context_length": loaded.engine.max_model_len}]}

    @router.post("/api/chat")
    async def chat(body: ChatRequest, request: Request):
        t0 = time.monotonic()
        loaded = _loaded(request, body.model)
        if not body.messages:
            return _loaded_reply(loaded, chat=True)
        req = _validated(ChatCompletionRequest, {
            "model": loaded.spec.id, "messages": _openai_messages(body.messages), "tools": body.tools,
            "response_format": _response_format(body.format), **body.options.sampler_fields(),
            **body.think_fields()})
        run = await start_chat(request, req, "ollama")
        return await _Reply(run, True, t0).respond(body.stream)

    @router.post("/api/generate")
    async def generate(body: GenerateRequest, request: Request):
        t0 = time.monotonic()
        if body.images:
            raise APIError(400, "images: this model takes no images (Ember serves text models)")
        for field in ("suffix", "template", "context"):
            if getattr(body, field):
                raise APIError(400, f"{field} is not supported by Ember's /api/generate"
                               + ("; send the conversation to /api/chat" if field == "context" else ""))
        loaded = _loaded(request, body.model)
        if not body.prompt:
            return _loaded_reply(loaded, chat=False)
        sampler = body.options.sampler_fields()
        if body.raw:
            run = await _start_raw(request, loaded, body.prompt, sampler, body.format)
        else:
            messages = ([{"role": "system", "content": body.system}] if body.system else []) + [
                {"role": "user", "content": body.prompt}]
            req = _validated(ChatCompletionRequest, {"model": loaded.spec.id, "messages": messages,
                                                     "response_format": _response_format(body.format), **sampler,
                                                     **body.think_fields()})
            run = await start_chat(request, req, "ollama")
        return await _Reply(run, False, t0).respond(body.stream)

    @router.post("/api/embed")
    async def embed(body: OllamaEmbedRequest, request: Request):
        t0 = time.monotonic()
        loaded = _loaded(request, body.model)
        inputs = [body.input] if isinstance(body.input, str) else body.input
        res = await request.app.state.embeddings.run(loaded, inputs, truncate=body.truncate)
        return ollama_embed_reply(body.model, res, body.dimensions, t0)

    @router.post("/api/embeddings")
    async def embeddings(body: OllamaEmbeddingsRequest, request: Request):
        loaded = _loaded(request, body.model)
        if not body.prompt:  # as Ollama: no text, no vector
            return {"embedding": []}
        return ollama_embeddings_reply(await request.app.state.embeddings.run(loaded, [body.prompt]))

    return router
