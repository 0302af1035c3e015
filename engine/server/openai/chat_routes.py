"""POST /v1/chat/completions: the shared chat pipeline (engine/server/chat.py) answered in
OpenAI's shape, n choices, streamed (SSE) or not. A reasoning model's thinking goes to
`reasoning_content`, apart from the answer in `content`, which alone is parsed for tool calls.
"""
from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.server.chat import ChatChoice, ChatRun, start_chat
from engine.server.openai import bodies as R
from engine.server.openai.file_search import add_sources
from engine.server.openai.protocol import ChatCompletionRequest
from engine.server.sse import SSE_HEADERS, job_events


def build_chat_router() -> APIRouter:
    router = APIRouter()

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        sources = None
        if body.documents is not None:  # an Ember extension: answer from these vector stores
            docs = body.documents
            found = await add_sources(request, body, docs.vector_store_ids, docs.max_num_results)
            body, sources = found.body, found.sources()
        run = await start_chat(request, body, "chatcmpl")
        created, tt = R.now(), R.TokenText(run.engine.tokenizer)
        if body.stream:
            return StreamingResponse(_ChatStream(run, created, tt, body, sources).events(),
                                     media_type="text/event-stream", headers=SSE_HEADERS)
        await run.collect()
        out = [{"index": c.index, "message": c.message(), "finish_reason": c.reason,
                "logprobs": {"content": R.chat_logprob_items(tt, c.lps)} if body.logprobs else None}
               for c in run.choices]
        return JSONResponse({"id": run.rid, "object": "chat.completion", "created": created, "model": run.model,
                             "choices": out, "usage": _usage(run.choices, len(run.prompt_ids)),
                             "system_fingerprint": None, **({"sources": sources} if sources is not None else {})})

    return router


def _usage(choices: list[ChatChoice], prompt_tokens: int) -> dict:
    """OpenAI counts the prompt once for n choices; cached: what the first found cached."""
    thinking = any(c.parser is not None for c in choices)
    return R.usage(prompt_tokens, sum(c.completion_tokens for c in choices), choices[0].cached,
                   sum(c.drafted for c in choices), sum(c.accepted for c in choices),
                   sum(c.reasoning_tokens for c in choices) if thinking else None)


@dataclass(slots=True)
class _ChatStream:
    """One chat reply as chat.completion.chunk events: each choice's deltas, then the usage chunk
    when the request asked for it. The first chunk carries the `sources` a `documents` request was
    given (None: no documents)."""
    run: ChatRun
    created: int
    tt: R.TokenText
    body: ChatCompletionRequest
    sources: list[dict] | None = None

    def events(self):
        return job_events(self.run.job, self.emit, self.done)

    def emit(self, item):
        run, with_usage = self.run, self.body.include_usage
        c = run.choices[run.index[item[0]]]
        c.add(item[1])
        for delta, reason, items in c.stream_deltas(item[1], self.tt, self.body.logprobs):
            chunk = R.chat_chunk(run.rid, run.model, self.created, delta, reason, items, with_usage)
            chunk["choices"][0]["index"] = c.index
            if self.sources is not None:
                chunk["sources"], self.sources = self.sources, None
            yield chunk

    def done(self):
        if self.body.include_usage:
            run = self.run
            yield R.usage_chunk(run.rid, run.model, self.created, "chat.completion.chunk",
                                _usage(run.choices, len(run.prompt_ids)))
