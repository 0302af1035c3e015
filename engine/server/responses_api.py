"""POST /v1/responses: OpenAI's Responses API on the chat path (responses_protocol.to_chat).

The reply becomes `output` items (a reasoning item with a thinking model's thoughts, a message
with output_text, and one function_call item per tool call); streamed, it is the typed event
sequence (response.created … response.completed,
each SSE with its `event:` line and a sequence_number), with no `[DONE]`. Nothing is stored,
so `previous_response_id` is a 400.
"""
from __future__ import annotations

import json
import secrets

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.server import responses as R
from engine.server.chat_routes import ChatChoice, ChatRun, start_chat
from engine.server.responses_protocol import ResponsesRequest
from engine.server.sse import SSE_HEADERS, job_events


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _message_item(item_id: str, text: str, status: str) -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [_text_part(text)] if text or status == "completed" else []}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _reasoning_item(item_id: str, text: str, status: str) -> dict:
    """A reasoning model's thoughts, as the Responses API carries them (reasoning_text content)."""
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def _call_item(call, status: str = "completed") -> dict:
    return {"type": "function_call", "id": _item_id("fc"), "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}


class ResponseBody:
    """The `response` object, in progress or finished, for one request."""

    def __init__(self, body: ResponsesRequest, run: ChatRun) -> None:
        self.body, self.run = body, run
        self.id, self.created = _item_id("resp"), R.now()

    def make(self, choice: ChatChoice | None, output: list[dict]) -> dict:
        b = self.body
        done = choice is not None and choice.reason is not None
        incomplete = done and choice.reason == "length"
        use = None
        if done:
            n_in, n_out = len(self.run.prompt_ids), choice.completion_tokens
            use = {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": choice.cached, "cache_write_tokens": 0},
                   "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": choice.reasoning_tokens},
                   "total_tokens": n_in + n_out}
        return {
            "id": self.id, "object": "response", "created_at": self.created, "model": self.run.model,
            "status": ("incomplete" if incomplete else "completed") if done else "in_progress",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "error": None, "output": output, "usage": use, "instructions": b.instructions,
            "tools": [t.model_dump(by_alias=True) for t in b.tools or ()],
            "tool_choice": (b.tool_choice.model_dump() if hasattr(b.tool_choice, "model_dump")
                            else b.tool_choice or "auto"),
            "parallel_tool_calls": b.parallel_tool_calls, "temperature": b.temperature, "top_p": b.top_p,
            "max_output_tokens": b.max_output_tokens, "previous_response_id": None, "store": False,
            "text": {"format": (b.text.format.model_dump(by_alias=True) if b.text and b.text.format
                                else {"type": "text"})},
            "truncation": "disabled", "metadata": b.metadata or {}, "user": b.user}


def _output(choice: ChatChoice) -> list[dict]:
    items = []
    status = "incomplete" if choice.reason == "length" else "completed"
    if choice.reasoning:
        items.append(_reasoning_item(_item_id("rs"), choice.reasoning, status))
    if choice.content:
        items.append(_message_item(_item_id("msg"), choice.content, status))
    items += [_call_item(c) for c in choice.calls]
    return items


def build_responses_router() -> APIRouter:
    router = APIRouter()

    @router.post("/v1/responses")
    async def create_response(body: ResponsesRequest, request: Request):
        run = await start_chat(request, body.to_chat(), "resp")
        resp = ResponseBody(body, run)
        if body.stream:
            return StreamingResponse(_events(run, resp), media_type="text/event-stream", headers=SSE_HEADERS)
        await run.collect()
        return JSONResponse(resp.make(run.choices[0], _output(run.choices[0])))

    return router


def _events(run: ChatRun, resp: ResponseBody):
    """The Responses stream: a message item opened on the first text, closed at the end; each
    tool call an item of its own with its arguments in one delta."""
    seq = iter(range(1 << 62))
    choice = run.choices[0]
    state = {"msg": None, "text": "", "output": [], "rs": None, "thought": ""}
    tt = R.TokenText(run.engine.tokenizer)

    def ev(kind: str, **data) -> str:
        payload = {"type": kind, "sequence_number": next(seq), **data}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"

    def open_message():
        state["msg"] = _item_id("msg")
        index = len(state["output"])
        yield ev("response.output_item.added", output_index=index,
                 item=_message_item(state["msg"], "", "in_progress"))
        yield ev("response.content_part.added", item_id=state["msg"], output_index=index, content_index=0,
                 part=_text_part(""))

    def close_message(status: str):
        if state["msg"] is None:
            return
        index, text = len(state["output"]), state["text"]
        ids = {"item_id": state["msg"], "output_index": index, "content_index": 0}
        yield ev("response.output_text.done", **ids, text=text, logprobs=[])
        yield ev("response.content_part.done", **ids, part=_text_part(text))
        item = _message_item(state["msg"], text, status)
        yield ev("response.output_item.done", output_index=index, item=item)
        state["output"].append(item)
        state["msg"] = None

    def open_reasoning():
        state["rs"] = _item_id("rs")
        yield ev("response.output_item.added", output_index=len(state["output"]),
                 item={**_reasoning_item(state["rs"], "", "in_progress"), "content": []})

    def close_reasoning(status: str):
        if state["rs"] is None:
            return
        index, text = len(state["output"]), state["thought"]
        yield ev("response.reasoning_text.done", item_id=state["rs"], output_index=index, content_index=0, text=text)
        item = _reasoning_item(state["rs"], text, status)
        yield ev("response.output_item.done", output_index=index, item=item)
        state["output"].append(item)
        state["rs"] = None

    def emit(item):
        out = item[1]
        if not choice.started:
            yield ev("response.created", response=resp.make(None, []))
            yield ev("response.in_progress", response=resp.make(None, []))
        choice.add(out)
        for delta, reason, _ in choice.stream_deltas(out, tt, False):
            if delta.get("reasoning_content"):
                if state["rs"] is None:
                    yield from open_reasoning()
                state["thought"] += delta["reasoning_content"]
                yield ev("response.reasoning_text.delta", item_id=state["rs"], output_index=len(state["output"]),
                         content_index=0, delta=delta["reasoning_content"])
            if delta.get("content") or delta.get("tool_calls") or reason is not None:
                yield from close_reasoning("incomplete" if reason == "length" else "completed")
            if delta.get("content"):
                if state["msg"] is None:
                    yield from open_message()
                state["text"] += delta["content"]
                yield ev("response.output_text.delta", item_id=state["msg"], output_index=len(state["output"]),
                         content_index=0, delta=delta["content"], logprobs=[])
            for call in choice.calls if delta.get("tool_calls") else ():
                yield from close_message("completed")
                index, it = len(state["output"]), _call_item(call, "in_progress")
                yield ev("response.output_item.added", output_index=index, item={**it, "arguments": ""})
                yield ev("response.function_call_arguments.delta", item_id=it["id"], output_index=index,
                         delta=call.arguments)
                yield ev("response.function_call_arguments.done", item_id=it["id"], output_index=index,
                         name=call.name, arguments=call.arguments)
                it["status"] = "completed"
                yield ev("response.output_item.done", output_index=index, item=it)
                state["output"].append(it)
            if reason is not None:
                yield from close_message("incomplete" if reason == "length" else "completed")
                final = resp.make(choice, state["output"])
                kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
                yield ev(kind, response=final)

    return job_events(run.job, run.first, emit, lambda: (), end=None)
