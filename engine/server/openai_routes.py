"""POST /v1/chat/completions and /v1/completions, streaming (SSE) or not.

A handler validates, builds the prompt, submits to the engine thread and awaits its own queue.
It waits for the first result before answering, so an error the engine finds (a prompt that
does not fit, a bad token id) is still a proper 4xx and not a broken stream.
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.loaders.chat_template import TemplateError
from engine.server import responses as R
from engine.server.errors import APIError, error_body
from engine.server.protocol import ChatCompletionRequest, CompletionRequest
from engine.server.serving import (Job, check_token_ids, encode, fit_context, require_model,
                                   sampling_params)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(data) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


def build_router() -> APIRouter:
    router = APIRouter()

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        state = request.app.state
        loaded = require_model(state.engine_thread, state.model_store, body.model)
        engine, model = loaded.engine, loaded.spec.id
        try:
            prompt = engine.chat_template.render([m.as_template_dict() for m in body.messages],
                                                 add_generation_prompt=True)
        except TemplateError as e:
            raise APIError(400, f"the chat template refused the messages: {e}", param="messages") from None
        ids = await encode(engine, prompt)
        max_tokens = body.requested_max_tokens
        if max_tokens == 0:
            raise APIError(400, "max_tokens must be at least 1", param="max_tokens", code="invalid_value")
        ids, max_tokens = fit_context(ids, max_tokens, body.truncate_prompt_tokens, engine.max_model_len)
        params = sampling_params(body, max_tokens, engine.tokenizer.vocab_size, body.num_logprobs)
        rid = R.new_id("chatcmpl")
        job = Job(state.engine_thread, request)
        job.submit(ids, params, rid, engine)
        tt = R.TokenText(engine.tokenizer)
        first = await job.first()
        created = R.now()
        if body.stream:
            return StreamingResponse(_chat_stream(job, first, rid, model, created, tt, body),
                                     media_type="text/event-stream", headers=SSE_HEADERS)
        try:
            out, lps = first[1], list(first[1].logprobs or [])
            while not out.finished:
                out = (await job.next())[1]
                lps += out.logprobs or []
        finally:
            job.close()
        items = R.chat_logprob_items(tt, lps) if body.logprobs else None
        use = R.usage(out.num_prompt_tokens, len(out.output_token_ids), out.num_cached_tokens)
        return JSONResponse(R.chat_completion(rid, model, created, out.text, out.finish_reason, use, items))

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        state = request.app.state
        loaded = require_model(state.engine_thread, state.model_store, body.model)
        engine, model = loaded.engine, loaded.spec.id
        vocab = engine.tokenizer.vocab_size
        scoring = body.echo and body.logprobs is not None
        requested = 16 if body.max_tokens is None else body.max_tokens
        plans = []  # (prompt ids, max_tokens, echo text)
        for p in body.prompts:
            ids = await encode(engine, p) if isinstance(p, str) else list(p)
            check_token_ids(ids, vocab)
            if not ids:
                raise APIError(400, "the prompt is empty", param="prompt", code="invalid_value")
            # scoring with max_tokens 0: the engine samples one token, which we drop
            want = requested or (1 if scoring else 0)
            kept, max_tokens = fit_context(ids, want, body.truncate_prompt_tokens,
                                           engine.max_model_len, what="prompt")
            echo = (p if isinstance(p, str) and len(kept) == len(ids)
                    else engine.tokenizer.decode(kept)) if body.echo else ""
            plans.append((kept, max_tokens, echo))
        if requested == 0 and not scoring:  # nothing to run: the prompt (if echoed) and no tokens
            choices = [R.completion_choice(i, e, "length", None) for i, (_, _, e) in enumerate(plans)]
            use = R.usage(sum(len(k) for k, _, _ in plans), 0)
            return JSONResponse(R.completion(R.new_id("cmpl"), model, R.now(), choices, use))
        rid = R.new_id("cmpl")
        job = Job(state.engine_thread, request)
        tt = R.TokenText(engine.tokenizer)
        index, choices = {}, []
        for i, (ids, max_tokens, echo) in enumerate(plans):
            params = sampling_params(body, max(max_tokens, 1), vocab, body.logprobs,
                                     body.logprobs if scoring else None)
            sub = f"{rid}-{i}"
            index[sub] = i
            job.submit(ids, params, sub, engine)
            choices.append(_Choice(i, ids, echo, body, tt, drop_output=requested == 0))
        first = await job.first()
        created = R.now()
        if body.stream:
            return StreamingResponse(_completion_stream(job, first, index, choices, rid, model, created, body),
                                     media_type="text/event-stream", headers=SSE_HEADERS)
        try:
            item = first
            while True:
                choices[index[item[0]]].add(item[1])
                if not job.unfinished:
                    break
                item = await job.next()
        finally:
            job.close()
        use = R.usage(sum(c.prompt_tokens for c in choices), sum(c.completion_tokens for c in choices),
                      sum(c.cached for c in choices))
        return JSONResponse(R.completion(rid, model, created, [c.final() for c in choices], use))

    return router


class _Choice:
    """One prompt's choice in a completions response, filled from its RequestOutputs."""

    def __init__(self, index: int, ids: list[int], echo: str, body: CompletionRequest,
                 tt: R.TokenText, drop_output: bool) -> None:
        self.index, self.ids, self.body, self.drop = index, ids, body, drop_output
        self.text = echo
        self.pending = echo  # text not yet sent in a stream chunk
        self.lp = R.CompletionLogprobs(tt) if body.logprobs is not None else None
        self.echoed = not body.echo
        self.reason, self.prompt_tokens, self.completion_tokens, self.cached = None, len(ids), 0, 0

    def add(self, out) -> None:
        if not self.echoed and self.lp is not None:
            plps = out.prompt_logprobs or [None] * len(self.ids)
            for tok, lp in zip(self.ids, plps):
                self.lp.add(tok, lp)
        self.echoed = True
        if not self.drop:
            self.text += out.new_text
            self.pending += out.new_text
            if self.lp is not None:
                for tok, lp in zip(out.new_token_ids, out.logprobs or [None] * len(out.new_token_ids)):
                    self.lp.add(tok, lp)
            self.completion_tokens = len(out.output_token_ids)
        if out.finished:
            self.reason = "length" if self.drop else out.finish_reason
            self.cached = out.num_cached_tokens

    def chunk(self) -> dict:
        text, self.pending = self.pending, ""
        return R.completion_choice(self.index, text, self.reason,
                                   self.lp.take() if self.lp is not None else None)

    def final(self) -> dict:
        lp = self.lp.take() if self.lp is not None else None
        return R.completion_choice(self.index, self.text, self.reason, lp)


async def _events(job: Job, first, emit, done) -> AsyncIterator[str]:
    """Drive a job as SSE: `emit(item)` yields chunks per output, `done()` the closing ones.
    Closing the generator (client gone) aborts the unfinished requests in `job.close()`."""
    try:
        item = first
        while True:
            for chunk in emit(item):
                yield sse(chunk)
            if not job.unfinished:
                break
            try:
                item = await job.next()
            except APIError as e:  # the engine failed or the model was switched mid-stream
                yield sse(error_body(e.status, e.message, e.code))
                break
        for chunk in done():
            yield sse(chunk)
        yield "data: [DONE]\n\n"
    finally:
        job.close()


def _chat_stream(job, first, rid, model, created, tt, body: ChatCompletionRequest):
    with_usage = body.include_usage
    state = {"out": None, "sent_role": False}

    def emit(item):
        out = item[1]
        state["out"] = out
        if not state["sent_role"]:
            state["sent_role"] = True
            yield R.chat_chunk(rid, model, created, {"role": "assistant", "content": ""}, with_usage=with_usage)
        if out.new_text or out.logprobs:
            items = R.chat_logprob_items(tt, out.logprobs) if body.logprobs else None
            yield R.chat_chunk(rid, model, created, {"content": out.new_text}, None, items, with_usage)
        if out.finished:
            yield R.chat_chunk(rid, model, created, {}, out.finish_reason, with_usage=with_usage)

    def done():
        out = state["out"]
        if with_usage and out is not None:
            use = R.usage(out.num_prompt_tokens, len(out.output_token_ids), out.num_cached_tokens)
            yield R.usage_chunk(rid, model, created, "chat.completion.chunk", use)

    return _events(job, first, emit, done)


def _completion_stream(job, first, index, choices, rid, model, created, body: CompletionRequest):
    with_usage = body.include_usage

    def emit(item):
        c = choices[index[item[0]]]
        c.add(item[1])
        if c.pending or c.reason is not None or (c.lp is not None and c.lp.tokens):
            yield R.completion_chunk(rid, model, created, c.chunk(), with_usage)

    def done():
        if with_usage:
            use = R.usage(sum(c.prompt_tokens for c in choices), sum(c.completion_tokens for c in choices),
                          sum(c.cached for c in choices))
            yield R.usage_chunk(rid, model, created, "text_completion", use)

    return _events(job, first, emit, done)
