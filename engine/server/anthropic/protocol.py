"""Anthropic's Messages API request shapes (/v1/messages, /v1/messages/count_tokens), validated by
pydantic, and their translation to the ChatCompletionRequest fields that engine.server.chat.start_chat takes.

Transcribed from Anthropic's API reference ("Messages", "Count message tokens"). Bounds on the
sampler knobs are Ember's own (openai/protocol.py's). Unknown fields (cache_control, citations, service
tiers) are ignored; content Ember cannot take (images, documents, server tools) is a 400 naming it.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from engine.server.errors import APIError
from engine.server.openai.protocol import INT32_MAX, StopString, few_stops

_config = ConfigDict(extra="ignore", allow_inf_nan=False)

ModelName = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class TextBlock(BaseModel):
    model_config = _config
    type: Literal["text"]
    text: str


class ToolUseBlock(BaseModel):
    """An assistant's tool call in the history."""
    model_config = _config
    type: Literal["tool_use"]
    id: str = Field(..., min_length=1, max_length=256)
    name: str = Field(..., max_length=128)
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(BaseModel):
    """A user's answer to a tool call: text, or text blocks."""
    model_config = _config
    type: Literal["tool_result"]
    tool_use_id: str = Field(..., min_length=1, max_length=256)
    content: str | list[dict] = ""
    is_error: bool = False


class OtherBlock(BaseModel):
    """A block Ember does not turn into text: an image goes to the model's projector (its `source`:
    base64 data, or a URL, which is refused), documents are refused, thinking blocks (a reply's
    reasoning sent back) are left out of the prompt, as templates drop old thoughts."""
    model_config = _config
    type: Literal["image", "document", "thinking", "redacted_thinking"]
    source: dict | None = None

    def image_url(self) -> str:
        """The image's source as an OpenAI image_url (a data: URI, or the URL chat_images refuses)."""
        s = self.source or {}
        if s.get("type") == "url":
            return str(s.get("url", ""))
        return f"data:{s.get('media_type') or 'application/octet-stream'};base64,{s.get('data', '')}"


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | OtherBlock, Field(discriminator="type")]


class Message(BaseModel):
    model_config = _config
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(BaseModel):
    """A client tool. Anthropic's server tools (bash_2025..., web_search_...) have a versioned type."""
    model_config = _config
    type: str | None = None
    name: str = Field(..., max_length=128)
    description: str | None = Field(None, max_length=1 << 16)
    input_schema: dict | None = None


class ToolChoice(BaseModel):
    model_config = _config
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(None, max_length=128)
    disable_parallel_tool_use: bool = False


class ThinkingConfig(BaseModel):
    """Extended thinking: on with a token budget (a reasoning model's <think> block, capped), or off
    (the template's enable_thinking: false)."""
    model_config = _config
    type: Literal["enabled", "disabled"]
    budget_tokens: int | None = Field(None, ge=0, le=INT32_MAX)


class CountTokensRequest(BaseModel):
    model_config = _config
    model: ModelName
    messages: list[Message] = Field(..., min_length=1, max_length=4096)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: ToolChoice | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(..., ge=1, le=INT32_MAX)
    stop_sequences: list[StopString] | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)  # Anthropic's range is 0..1; Ember's sampler takes 2
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=INT32_MAX)
    stream: bool = False
    metadata: dict | None = None  # user_id: accepted, unused
    thinking: ThinkingConfig | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _few_stops(cls, v):
        return few_stops(v, "stop sequences")


# ---- to OpenAI's shape ---------------------------------------------------------------------------
def _text(blocks: str | list, where: str) -> str:
    """Text blocks joined by blank lines (agents send a turn as several blocks)."""
    if isinstance(blocks, str):
        return blocks
    parts = []
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else b.type
        if kind != "text":
            raise APIError(400, f"{where}.{j}: {kind} blocks are not supported here (Ember serves text models)")
        parts.append(b["text"] if isinstance(b, dict) else b.text)
    return "\n\n".join(parts)


def _joined(texts: list) -> str | list[dict]:
    """Text blocks joined by blank lines; with images, OpenAI content parts in their order."""
    if all(isinstance(t, str) for t in texts):
        return "\n\n".join(texts)
    last = len(texts) - 1
    return [t if isinstance(t, dict) else {"type": "text", "text": t + ("\n\n" if k < last else "")}
            for k, t in enumerate(texts)]


def openai_messages(body: CountTokensRequest) -> list[dict]:
    """The system prompt and turns as OpenAI messages: tool_use blocks become an assistant's
    tool_calls (same ids), each tool_result a `tool` message; a user turn's text follows its results."""
    out = [{"role": "system", "content": _text(body.system, "system")}] if body.system else []
    for i, m in enumerate(body.messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        texts, calls = [], []  # texts: strings, and an image's OpenAI part where it stands
        for j, b in enumerate(m.content):
            where = f"messages.{i}.content.{j}"
            if isinstance(b, TextBlock):
                texts.append(b.text)
            elif b.type == "image":
                texts.append({"type": "image_url", "image_url": {"url": b.image_url()}})
            elif b.type == "document":
                raise APIError(400, f"{where}: document blocks are not supported (Ember serves text models)")
            elif isinstance(b, ToolUseBlock):
                if m.role != "assistant":
                    raise APIError(400, f"{where}: tool_use blocks belong in assistant turns")
                calls.append({"id": b.id, "type": "function",
                              "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}})
            elif isinstance(b, ToolResultBlock):
                if m.role != "user":
                    raise APIError(400, f"{where}: tool_result blocks belong in user turns")
                content = _text(b.content, f"{where}.content")
                out.append({"role": "tool", "tool_call_id": b.tool_use_id,
                            "content": f"Error: {content}" if b.is_error else content})
        if texts or calls or not m.content:
            d = {"role": m.role, "content": _joined(texts)}
            if calls:
                d["tool_calls"] = calls
            out.append(d)
    if body.messages[-1].role == "assistant":
        raise APIError(400, "messages: a final assistant turn (prefill) is not supported; end with a user turn")
    return out


def openai_tools(body: CountTokensRequest) -> dict:
    """tools and tool_choice as ChatCompletionRequest fields."""
    if not body.tools:
        return {}
    for i, t in enumerate(body.tools):
        if t.type not in (None, "custom"):
            raise APIError(400, f"tools.{i}: server tool {t.type!r} is not supported; give a client tool "
                           "(name, description, input_schema)")
    d: dict = {"tools": [{"type": "function", "function": {
        "name": t.name, "description": t.description,
        "parameters": t.input_schema or {"type": "object", "properties": {}}}} for t in body.tools]}
    c = body.tool_choice
    if c is not None:
        if c.type == "tool" and not c.name:
            raise APIError(400, "tool_choice: type 'tool' needs the tool's name")
        d["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(c.type) or {
            "type": "function", "function": {"name": c.name}}
        d["parallel_tool_calls"] = not c.disable_parallel_tool_use
    return d


def sampler_fields(body: MessagesRequest) -> dict:
    d = {"max_tokens": body.max_tokens, "temperature": body.temperature, "stop": body.stop_sequences}
    if body.top_p is not None:
        d["top_p"] = body.top_p
    if body.top_k is not None:
        d["top_k"] = body.top_k
    if body.thinking is not None:
        d["chat_template_kwargs"] = {"enable_thinking": body.thinking.type == "enabled"}
        if body.thinking.type == "enabled" and body.thinking.budget_tokens is not None:
            d["max_reasoning_tokens"] = body.thinking.budget_tokens
    return d
