"""POST /v1/responses: OpenAI's Responses API on the chat path (responses_protocol.to_chat).

The reply is the `response` object of responses_output.py; streamed, it is the typed event
sequence (response.created … response.completed, each SSE with its `event:` line and a
sequence_number), with no `[DONE]`. Nothing is stored, so `previous_response_id` is a 400.
"""
from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.server.openai import bodies as R
from engine.server.chat import ChatRun, start_chat
from engine.server.openai.responses_output import (ResponseBody, call_item, message_item, new_item_id, output_items,
                                            reasoning_item, text_part)
from engine.server.openai.file_search import add_sources, file_citations, file_search_call
from engine.server.openai.responses_images import inline_file_images
from engine.server.openai.responses_protocol import ResponsesRequest
from engine.server.sse import SSE_HEADERS, job_events


def build_responses_router() -> APIRouter:
    router = APIRouter()

    @router.post("/v1/responses")
    async def create_response(body: ResponsesRequest, request: Request):
        chat, search, hits = (await inline_file_images(request, body)).to_chat(), None, []
        if (tool := body.file_search) is not None:  # searched before the reply: see file_search.py
            found = await add_sources(request, chat, tool.vector_store_ids, tool.max_num_results, tool.filters)
            chat, hits = found.body, found.hits
            search = file_search_call(new_item_id("fs"), found.query, hits,
                                      "file_search_call.results" in (body.include or ()))
        run = await start_chat(request, chat, "resp")
        resp = ResponseBody(body, run)
        if body.stream:
            events = _ResponseEvents(run, resp, search, hits)
            return StreamingResponse(job_events(run.job, events.emit, lambda: (), end=None),
                                     media_type="text/event-stream", headers=SSE_HEADERS)
        await run.collect()
        output = [search] if search else []
        for item in output_items(run.choices[0]):
            if item["type"] == "message" and hits:
                item["content"][0]["annotations"] = file_citations(item["content"][0]["text"], hits)
            output.append(item)
        return JSONResponse(resp.make(run.choices[0], output))

    return router


class _ResponseEvents:
    """The Responses stream of one choice: a reasoning item and a message item, each opened on
    its first text and closed when the next begins or at the end; each tool call an item of its
    own with its arguments in one delta. A file_search_call item, done before the reply, comes first."""

    def __init__(self, run: ChatRun, resp: ResponseBody, search: dict | None = None, hits=()) -> None:
        self.resp, self.choice = resp, run.choices[0]
        self.search, self.hits = search, list(hits)
        self.tt = R.TokenText(run.engine.tokenizer)
        self.seq = iter(range(1 << 62))
        self.output: list[dict] = []  # the finished items
        self.msg, self.text = None, ""  # the open message item's id, and its text
        self.rs, self.thought = None, ""  # the open reasoning item's id, and its text

    def ev(self, kind: str, **data) -> str:
        payload = {"type": kind, "sequence_number": next(self.seq), **data}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"

    def emit(self, item):
        out, choice = item[1], self.choice
        if not choice.started:
            yield self.ev("response.created", response=self.resp.make(None, []))
            yield self.ev("response.in_progress", response=self.resp.make(None, []))
            yield from self.searched()
        choice.add(out)
        for delta, reason, _ in choice.stream_deltas(out, self.tt, False):
            status = "incomplete" if reason == "length" else "completed"
            if delta.get("reasoning_content"):
                yield from self.reasoning_delta(delta["reasoning_content"])
            if delta.get("content") or delta.get("tool_calls") or reason is not None:
                yield from self.close_reasoning(status)
            if delta.get("content"):
                yield from self.text_delta(delta["content"])
            for call in choice.calls if delta.get("tool_calls") else ():
                yield from self.close_message("completed")
                yield from self.call(call)
            if reason is not None:
                yield from self.close_message(status)
                yield from self.finish()

    def searched(self):
        if self.search is None:
            return
        index, item = len(self.output), self.search
        yield self.ev("response.output_item.added", output_index=index,
                      item={**item, "status": "in_progress", "results": None})
        for step in ("in_progress", "searching", "completed"):
            yield self.ev(f"response.file_search_call.{step}", output_index=index, item_id=item["id"])
        yield self.ev("response.output_item.done", output_index=index, item=item)
        self.output.append(item)

    def reasoning_delta(self, text: str):
        if self.rs is None:
            self.rs = new_item_id("rs")
            yield self.ev("response.output_item.added", output_index=len(self.output),
                          item={**reasoning_item(self.rs, "", "in_progress"), "content": []})
        self.thought += text
        yield self.ev("response.reasoning_text.delta", item_id=self.rs, output_index=len(self.output),
                      content_index=0, delta=text)

    def close_reasoning(self, status: str):
        if self.rs is None:
            return
        index, text = len(self.output), self.thought
        yield self.ev("response.reasoning_text.done", item_id=self.rs, output_index=index, content_index=0,
                      text=text)
        item = reasoning_item(self.rs, text, status)
        yield self.ev("response.output_item.done", output_index=index, item=item)
        self.output.append(item)
        self.rs = None

    def text_delta(self, text: str):
        if self.msg is None:
            self.msg = new_item_id("msg")
            index = len(self.output)
            yield self.ev("response.output_item.added", output_index=index,
                          item=message_item(self.msg, "", "in_progress"))
            yield self.ev("response.content_part.added", item_id=self.msg, output_index=index, content_index=0,
                          part=text_part(""))
        self.text += text
        yield self.ev("response.output_text.delta", item_id=self.msg, output_index=len(self.output),
                      content_index=0, delta=text, logprobs=[])

    def close_message(self, status: str):
        if self.msg is None:
            return
        index, text = len(self.output), self.text
        ids = {"item_id": self.msg, "output_index": index, "content_index": 0}
        yield self.ev("response.output_text.done", **ids, text=text, logprobs=[])
        part = {**text_part(text), "annotations": file_citations(text, self.hits)}
        yield self.ev("response.content_part.done", **ids, part=part)
        item = {**message_item(self.msg, text, status), "content": [part]}
        yield self.ev("response.output_item.done", output_index=index, item=item)
        self.output.append(item)
        self.msg = None

    def call(self, call):
        index, it = len(self.output), call_item(call, "in_progress")
        yield self.ev("response.output_item.added", output_index=index, item={**it, "arguments": ""})
        yield self.ev("response.function_call_arguments.delta", item_id=it["id"], output_index=index,
                      delta=call.arguments)
        yield self.ev("response.function_call_arguments.done", item_id=it["id"], output_index=index,
                      name=call.name, arguments=call.arguments)
        it["status"] = "completed"
        yield self.ev("response.output_item.done", output_index=index, item=it)
        self.output.append(it)

    def finish(self):
        final = self.resp.make(self.choice, self.output)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield self.ev(kind, response=final)
