"""Documents in a chat: the vector stores' best passages for the user's question, put into that
turn as numbered sources (engine/docs/sources.py) before the chat pipeline renders the prompt.

Two ways in: chat completions' `documents` extension (the window's chats; the reply carries the
`sources` it was given) and the Responses API's `file_search` tool (a `file_search_call` output
item, and `file_citation` annotations where the answer cites `[n]`). The search runs before the
reply, on the question as the user wrote it: a small local model answers better from passages it
is handed than by deciding to call a search tool itself, and it costs one embedding.
"""
from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from engine.docs.retrieve import Hit
from engine.docs.sources import citations, sources_block, with_sources
from engine.server.errors import APIError
from engine.server.model_use import use_model
from engine.server.openai.content_parts import TextPart
from engine.server.openai.protocol import ChatCompletionRequest
from engine.server.openai.vector_store_routes import search_stores
from engine.server.serving import encode

TEMPLATE_SLACK = 16  # tokens a chat template adds per message (role markers), at most, in the families here

def _last_user(body: ChatCompletionRequest) -> int:
    for i in range(len(body.messages) - 1, -1, -1):
        if body.messages[i].role == "user":
            return i
    raise APIError(400, "documents need a user message to search for", code="invalid_value", param="messages")


@dataclass(frozen=True, slots=True)
class Found:
    body: ChatCompletionRequest  # the request with the sources in its last user turn
    hits: list[Hit]  # the passages given, [1] first
    query: str  # what was searched: the turn's words
    attributes: dict[str, dict]  # each file's attributes (the window keeps the local path there)

    def sources(self) -> list[dict]:
        """The `sources` a reply carries: what [n] in its text refers to."""
        return [{"index": n, "file_id": h.file_id, "filename": h.filename, "location": h.location, "text": h.text,
                 "score": round(h.score, 6), "vector_store_id": h.store_id,
                 "attributes": self.attributes.get(h.file_id, {})} for n, h in enumerate(self.hits, 1)]


async def add_sources(request: Request, body: ChatCompletionRequest, store_ids: list[str], top_k: int,
                      filters: dict | None = None) -> Found:
    """The stores' passages for the last user turn, put into it (see the module's docstring)."""
    i = _last_user(body)
    msg = body.messages[i]
    question = _text(msg)
    hits, attributes = await search_stores(request, store_ids, question, top_k, filters)
    hits = await _fitting(request, body, question, hits)
    messages = list(body.messages)
    if isinstance(msg.content, list) and hits:  # text and images: the sources go before them all
        content = [TextPart(type="text", text=sources_block(hits)), *msg.content]
    else:
        content = with_sources(question, hits)
    messages[i] = msg.model_copy(update={"content": content})
    return Found(body.model_copy(update={"messages": messages}), hits, question, attributes)


def _text(msg) -> str:
    """The words of a message, its images left out (what is searched for)."""
    if isinstance(msg.content, list):
        return "".join(p.text for p in msg.content if p.type == "text")
    return msg.content or ""


async def _fitting(request: Request, body: ChatCompletionRequest, question: str, hits: list[Hit]) -> list[Hit]:
    """The best passages that fit the chat model's context beside the conversation and room for the
    answer (a quarter of the context, or max_tokens if less): the lowest ranked are left out first."""
    engine = (await use_model(request, body.model)).engine
    ctx, asked = engine.max_model_len, body.requested_max_tokens
    room = ctx - min(asked or ctx // 4, ctx // 4) - TEMPLATE_SLACK * len(body.messages)
    conversation = "\n".join(_text(m) for m in body.messages if m.content)
    used = len(await encode(engine, conversation)) - len(await encode(engine, question))
    while hits and used + len(await encode(engine, with_sources(question, hits))) > room:
        hits = hits[:-1]
    return hits


def file_search_call(item_id: str, query: str, hits: list[Hit], with_results: bool) -> dict:
    """The Responses API's file_search_call output item (its results only when `include` asks)."""
    results = [{"file_id": h.file_id, "filename": h.filename, "score": round(h.score, 6), "text": h.text,
                "attributes": {"location": h.location}} for h in hits] if with_results else None
    return {"type": "file_search_call", "id": item_id, "status": "completed", "queries": [query],
            "results": results}


def file_citations(text: str, hits: list[Hit]) -> list[dict]:
    """file_citation annotations for each `[n]` the answer writes, at the citation's position."""
    return [{"type": "file_citation", "index": start, "file_id": hits[n - 1].file_id,
             "filename": hits[n - 1].filename} for n, start, _ in citations(text, len(hits))]
