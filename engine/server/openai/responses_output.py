"""The Responses API's `response` object and its `output` items, finished or in progress: a
reasoning item with a thinking model's thoughts, a message with output_text, and one
function_call item per tool call (the route and its event stream are in responses_routes.py).
"""
from __future__ import annotations

import secrets

from engine.server.openai import bodies as R
from engine.server.chat import ChatChoice, ChatRun
from engine.server.openai.responses_protocol import ResponsesRequest


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def message_item(item_id: str, text: str, status: str) -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [text_part(text)] if text or status == "completed" else []}


def text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_item(item_id: str, text: str, status: str) -> dict:
    """A reasoning model's thoughts, as the Responses API carries them (reasoning_text content)."""
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def call_item(call, status: str = "completed") -> dict:
    return {"type": "function_call", "id": new_item_id("fc"), "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}


def output_items(choice: ChatChoice) -> list[dict]:
    """A finished choice's `output`: its thoughts, its text, its tool calls."""
    items = []
    status = "incomplete" if choice.reason == "length" else "completed"
    if choice.reasoning:
        items.append(reasoning_item(new_item_id("rs"), choice.reasoning, status))
    if choice.content:
        items.append(message_item(new_item_id("msg"), choice.content, status))
    items += [call_item(c) for c in choice.calls]
    return items


class ResponseBody:
    """The `response` object, in progress or finished, for one request."""

    def __init__(self, body: ResponsesRequest, run: ChatRun) -> None:
        self.body, self.run = body, run
        self.id, self.created = new_item_id("resp"), R.now()

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
