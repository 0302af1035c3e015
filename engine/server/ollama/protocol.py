"""Ollama's request shapes (/api/chat, /api/generate, /api/show), validated by pydantic.

Transcribed from Ollama's API reference (docs/api.md, api/types.go). Bounds are Ember's own
(openai/protocol.py's), so a value the sampler cannot take is a 400 naming Ollama's field. Unknown
fields and options are ignored, as Ollama does.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from engine.server.openai.protocol import INT32_MAX, StopString, few_stops
from engine.server.tool_protocol import Tool

_config = ConfigDict(extra="ignore", allow_inf_nan=False)

ModelName = Annotated[str, StringConstraints(min_length=1, max_length=256)]
KeepAlive = float | str | None  # "5m", 300, 0, -1: accepted, see routes.py


class Options(BaseModel):
    """The sampler's part of Ollama's options. None: Ollama's default (see `sampler_fields`)."""
    model_config = _config
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    num_predict: int | None = Field(None, ge=-2, le=INT32_MAX)  # -1: no limit, -2: fill the context
    stop: StopString | list[StopString] | None = None
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    # the loaded model's context was sized when it loaded (--max-model-len, the KV pool) and is
    # shared by every chat: a request's num_ctx cannot change it, so it is accepted and ignored
    num_ctx: int | None = None

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, v):
        return few_stops(v)

    def sampler_fields(self) -> dict:
        """The options as SamplingRequest fields (openai/protocol.py), with Ollama's defaults for the
        sampler (api/types.go DefaultOptions: temperature 0.8, top_k 40, top_p 0.9). Ollama's
        repeat_penalty 1.1 looks at the last 64 tokens, Ember's at the whole reply, so it is off
        unless asked for."""
        d = {"temperature": 0.8 if self.temperature is None else self.temperature,
             "top_k": 40 if self.top_k is None else self.top_k,
             "top_p": 0.9 if self.top_p is None else self.top_p}
        for ours, theirs in (("min_p", "min_p"), ("seed", "seed"), ("stop", "stop"),
                             ("repetition_penalty", "repeat_penalty"),
                             ("presence_penalty", "presence_penalty"),
                             ("frequency_penalty", "frequency_penalty")):
            v = getattr(self, theirs)
            if v is not None:
                d[ours] = v
        if self.num_predict is not None and self.num_predict >= 0:
            d["max_tokens"] = self.num_predict  # negative: until the context is full (None)
        return d


class ToolCallFunction(BaseModel):
    model_config = _config
    name: str = Field(..., max_length=64)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(BaseModel):
    model_config = _config
    function: ToolCallFunction


class Message(BaseModel):
    model_config = _config
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = Field(None, max_length=128)
    tool_name: str | None = Field(None, max_length=64)


def openai_content(text: str, images: list[str] | None) -> str | list[dict]:
    """A message's text and images (base64, as Ollama sends them) as OpenAI content parts, the
    images first, so that images.k is content[k] in an error that names one."""
    if not images:
        return text
    return [*({"type": "image_url", "image_url": {"url": "data:application/octet-stream;base64," + b}}
              for b in images), {"type": "text", "text": text}]


Format = Literal["", "json"] | dict | None


class _Request(BaseModel):
    model_config = _config
    model: ModelName
    stream: bool = True
    format: Format = None
    options: Options = Field(default_factory=Options)
    keep_alive: KeepAlive = None
    think: bool | Literal["low", "medium", "high"] | None = None  # a reasoning model's switch, or its effort

    def think_fields(self) -> dict:
        """`think` as the chat request's fields: true/false for the template's enable_thinking
        (Qwen3, SmolLM3), a level for its reasoning effort (gpt-oss)."""
        if self.think is None:
            return {}
        if isinstance(self.think, bool):
            return {"chat_template_kwargs": {"enable_thinking": self.think}}
        return {"reasoning_effort": self.think}


class ChatRequest(_Request):
    messages: list[Message] = Field(default_factory=list, max_length=4096)
    tools: list[Tool] | None = Field(None, max_length=128)


class GenerateRequest(_Request):
    prompt: str = Field("", max_length=8 << 20)
    system: str | None = Field(None, max_length=8 << 20)
    raw: bool = False
    images: list[str] | None = None
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None


class ShowRequest(BaseModel):
    model_config = _config
    model: ModelName | None = None
    name: ModelName | None = None  # the old spelling


class PullRequest(BaseModel):
    model_config = _config
    model: ModelName | None = None
    name: ModelName | None = None  # the old spelling
    insecure: bool = False  # Ember's downloads always verify TLS; accepted and ignored
    stream: bool = True
