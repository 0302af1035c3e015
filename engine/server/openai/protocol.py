"""OpenAI request shapes (chat completions, completions), validated by pydantic. The chat request
is also what Ollama's and Anthropic's requests are translated to: the shared chat pipeline
(engine/server/chat.py) takes it.

Transcribed from OpenAI's API reference the way llama-cpp-python's `types.py` does: shared
`Field`s for the sampler knobs, bounds on every number so that a bad value is a 400 and never
a crash or a huge allocation. Unknown fields are ignored; fields we cannot honour (suffix,
best_of) are refused. Tool and response_format shapes live in `engine/server/tool_protocol.py`.
Responses are plain dicts built in `bodies.py`.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from engine.images import MEDIA_MARKER
from engine.server.openai.content_parts import ImagePart, TextPart
from engine.server.tool_protocol import ResponseFormat, Tool, ToolCall, ToolChoice

INT32_MAX = 2**31 - 1
MAX_STOP_STRINGS = 16
MAX_PROMPTS = 64
MAX_CHOICES = 16
MAX_LOGIT_BIAS = 1024

_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)

model_field = Field(None, max_length=256, description="Model id; the loaded model when omitted.")
temperature_field = Field(1.0, ge=0.0, le=2.0, description="0 means greedy decoding.")
top_p_field = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling: keep the smallest set of tokens with this mass.")
top_k_field = Field(0, ge=-1, le=INT32_MAX, description="Keep the k likeliest tokens; 0 or -1 is off.")
min_p_field = Field(0.0, ge=0.0, le=1.0, description="Drop tokens below min_p times the top probability.")
frequency_penalty_field = Field(0.0, ge=-2.0, le=2.0)
presence_penalty_field = Field(0.0, ge=-2.0, le=2.0)
repetition_penalty_field = Field(1.0, gt=0.0, le=10.0, description="CTRL-style; 1 is off.")
seed_field = Field(None, ge=-(2**63), le=2**63 - 1, description="Same seed, same text.")
max_tokens_field = Field(None, ge=0, le=INT32_MAX)
truncate_field = Field(
    None, ge=-1, le=INT32_MAX,
    description="Keep only the last k prompt tokens; -1 keeps as many as fit the context. "
                "Without it a prompt longer than the context is a 400 context_length_exceeded.")

StopString = Annotated[str, StringConstraints(min_length=1, max_length=256)]
TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=INT32_MAX)]], Field(min_length=1)]


def few_stops(v, what: str = "stop strings"):
    """A request's stop strings (a list of them) are at most MAX_STOP_STRINGS, in every API."""
    if isinstance(v, list) and len(v) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} {what}")
    return v


class StreamOptions(BaseModel):
    model_config = _config
    include_usage: bool = False


class SamplingRequest(BaseModel):
    """The fields chat and completions share."""
    model_config = _config

    model: str | None = model_field
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopString | list[StopString] | None = None
    max_tokens: int | None = max_tokens_field
    temperature: float = temperature_field
    top_p: float = top_p_field
    top_k: int = top_k_field
    min_p: float = min_p_field
    frequency_penalty: float = frequency_penalty_field
    presence_penalty: float = presence_penalty_field
    repetition_penalty: float = repetition_penalty_field
    seed: int | None = seed_field
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="Choices per prompt; the prompt is computed once.")
    user: str | None = Field(None, max_length=256)
    logit_bias: dict[str, float] | None = None
    truncate_prompt_tokens: int | None = truncate_field
    # extensions (vLLM names): benchmarks need fixed-length replies; background jobs a priority
    ignore_eos: bool = Field(False, description="Keep generating past end-of-sequence tokens.")
    priority: int = Field(0, ge=0, le=10, description="Lower runs first; the app's chats use 0.")
    speculative: Literal["auto", "off"] = Field(
        "auto", description="off: no speculative decoding for this request (the output is the same either way).")
    max_tokens_fit: bool = Field(
        False, description="Cap max_tokens at what the context leaves after the prompt, as llama.cpp's server "
                           "does, instead of refusing the request (the desktop app's chats ask this).")

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, v):
        return few_stops(v)

    @field_validator("logit_bias")
    @classmethod
    def _token_ids_to_bias(cls, v):
        if not v:
            return v
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} logit_bias entries")
        for k, b in v.items():
            if not k.isdigit() or int(k) > INT32_MAX:
                raise ValueError(f"logit_bias keys must be token ids, not {k[:32]!r}")
            if not -100.0 <= b <= 100.0:
                raise ValueError("logit_bias values must be between -100 and 100")
        return v

    @property
    def token_bias(self) -> dict[int, float]:
        return {int(k): b for k, b in (self.logit_bias or {}).items()}

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatMessage(BaseModel):
    model_config = _config
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Annotated[TextPart | ImagePart, Field(discriminator="type")]] | None = None
    name: str | None = Field(None, max_length=256)
    tool_calls: list[ToolCall] | None = Field(None, max_length=128)  # an assistant's calls
    tool_call_id: str | None = Field(None, max_length=256)  # a tool result's call
    reasoning_content: str | None = None  # an assistant's thinking: read only when its reply is continued

    @model_validator(mode="after")
    def _tool_result_names_its_call(self):
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a message with role 'tool' needs the tool_call_id it answers")
        return self

    @property
    def text(self) -> str:
        content = self.content
        if isinstance(content, list):  # an image stands where it was sent, as mtmd's marker
            content = "".join(p.text if p.type == "text" else MEDIA_MARKER for p in content)
        return content or ""

    @property
    def image_parts(self) -> list[tuple[int, ImagePart]]:
        """(index in content, part) of each image, in order."""
        content = self.content if isinstance(self.content, list) else []
        return [(j, p) for j, p in enumerate(content) if p.type == "image_url"]

    def as_template_dict(self) -> dict:
        """What a chat template sees: role and plain-text content ("developer" is OpenAI's new
        name for the system role), and tool calls the way HF templates read them."""
        role = "system" if self.role == "developer" else self.role
        d = {"role": role, "content": self.text}
        if self.name:
            d["name"] = self.name
        if self.tool_calls:
            d["tool_calls"] = [c.template_dict() for c in self.tool_calls]
        if self.tool_call_id:
            d["tool_call_id"] = self.tool_call_id
        return d


class DocumentsOption(BaseModel):
    """`documents` (an Ember extension): answer from these vector stores' passages (file_search.py)."""
    model_config = _config
    vector_store_ids: list[Annotated[str, Field(max_length=64)]] = Field(..., min_length=1, max_length=16)
    max_num_results: int = Field(5, ge=1, le=20)


# The chat template's own variables, which a request's chat_template_kwargs may not replace.
TEMPLATE_RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(..., min_length=1, max_length=4096)
    max_completion_tokens: int | None = max_tokens_field
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    # a reasoning model's switches, handed to its chat template (llama.cpp's server takes the same)
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, max_length=64, description="Extra variables for the chat template, e.g. {\"enable_thinking\": false}.")
    max_reasoning_tokens: int | None = Field(
        None, ge=0, le=INT32_MAX, description="Tokens a reasoning model may think before Ember closes the block.")
    continue_final_message: bool = Field(
        False, description="Continue the last message, the assistant's (its reasoning_content, then its content), "
                           "instead of starting a new reply, as vLLM's field does.")
    documents: DocumentsOption | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _no_reserved_names(cls, v):
        taken = sorted(set(v or ()) & TEMPLATE_RESERVED)
        if taken:
            raise ValueError(f"{', '.join(taken)} cannot be set through chat_template_kwargs")
        return v

    @property
    def template_variables(self) -> dict[str, Any]:
        """What the chat template sees beyond the messages and tools."""
        extra = dict(self.chat_template_kwargs or {})
        if self.reasoning_effort is not None:
            extra["reasoning_effort"] = self.reasoning_effort
        return extra

    @model_validator(mode="after")
    def _continues_the_assistant(self):
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise ValueError("continue_final_message needs the last message to be the assistant's")
        return self

    @model_validator(mode="after")
    def _tools_agree(self):
        names = [t.function.name for t in self.tools or ()]
        if len(set(names)) != len(names):
            raise ValueError("tools: function names must be unique")
        choice = self.tool_choice
        if choice is not None and not isinstance(choice, str) and choice.function.name not in names:
            raise ValueError(f"tool_choice names the function {choice.function.name!r}, "
                             "which is not among the tools")
        if choice in ("required",) and not names:
            raise ValueError("tool_choice 'required' needs at least one tool")
        called = set()
        for i, m in enumerate(self.messages):
            called.update(c.id for c in m.tool_calls or ())
            if m.role == "tool" and m.tool_call_id not in called:
                raise ValueError(f"messages.{i}: tool_call_id {m.tool_call_id!r} answers no "
                                 "earlier assistant tool call")
        return self

    @property
    def active_tools(self) -> list[Tool]:
        """The tools the model may call: none with tool_choice 'none', else all of them."""
        return [] if self.tool_choice == "none" else list(self.tools or ())

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        """None: no logprobs; k: the chosen token's logprob plus the top k."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(SamplingRequest):
    prompt: (Annotated[str, StringConstraints(max_length=8 << 20)]
             | Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)]
             | TokenIds
             | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)])
    max_tokens: int | None = Field(16, ge=0, le=INT32_MAX)  # OpenAI's default for completions
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v):
        if v:
            raise ValueError("suffix (fill-in-the-middle) is not supported")
        return v

    @field_validator("best_of")
    @classmethod
    def _best_of_one(cls, v):
        if v not in (None, 1):
            raise ValueError("only best_of=1 is supported")
        return v

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of prompts: one string or one token list each."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and isinstance(p[0], int):
            return [list(p)]
        return list(p)
