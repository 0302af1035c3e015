"""OpenAI Responses API request shapes (`POST /v1/responses`), the stateless core: text and
message input items, function calls and their outputs, instructions, function tools,
`text.format`. `to_chat()` maps a request onto a chat completion request, so both APIs run
through one path (templates, grammars, tool parsing) in engine/server/chat.py.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.server.errors import APIError
from engine.server.openai.protocol import (ChatCompletionRequest, max_tokens_field, model_field, seed_field,
                                    temperature_field, top_p_field)
from engine.server.openai.content_parts import MAX_IMAGE_URL_CHARS
from engine.server.tool_protocol import FUNCTION_NAME

_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)


class ContentPart(BaseModel):
    model_config = _config
    type: Literal["input_text", "output_text", "text"] = "input_text"
    text: str


class InputImagePart(BaseModel):
    """An image in a message: a base64 `data:` URI (or an http(s) URL, fetched only where the server
    allows it), or the id of a file uploaded to /v1/files (responses_images.py inlines it)."""
    model_config = _config
    type: Literal["input_image"]
    image_url: str | None = Field(None, max_length=MAX_IMAGE_URL_CHARS)
    file_id: str | None = Field(None, max_length=256)
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the projector sets the resolution


class MessageItem(BaseModel):
    model_config = _config
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart | InputImagePart]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(
            p.text for p in self.content if isinstance(p, ContentPart))

    @property
    def has_images(self) -> bool:
        return not isinstance(self.content, str) and any(isinstance(p, InputImagePart) for p in self.content)

    def chat_content(self, where: str) -> str | list[dict]:
        """The content as a chat message's: text, or parts with each image where it was sent."""
        if not self.has_images:
            return self.text
        parts = []
        for j, p in enumerate(self.content):
            if isinstance(p, ContentPart):
                parts.append({"type": "text", "text": p.text})
            elif p.image_url is None:
                raise APIError(400, f"{where}.content[{j}]: an input_image needs an image_url (a base64 data: URI) "
                                    "or the file_id of an uploaded image", param=f"{where}.content[{j}]",
                               code="invalid_value")
            else:
                parts.append({"type": "image_url", "image_url": {"url": p.image_url}})
        return parts


class FunctionCallItem(BaseModel):
    model_config = _config
    type: Literal["function_call"]
    call_id: str = Field(..., max_length=256)
    name: str = Field(..., max_length=64)
    arguments: str = Field("{}", max_length=1 << 20)


class FunctionCallOutputItem(BaseModel):
    model_config = _config
    type: Literal["function_call_output"]
    call_id: str = Field(..., max_length=256)
    output: str


class FunctionTool(BaseModel):
    model_config = _config
    type: Literal["function"]
    name: str = Field(..., pattern=FUNCTION_NAME)
    description: str | None = Field(None, max_length=8192)
    parameters: dict | None = None
    strict: bool | None = None


class FileSearchTool(BaseModel):
    """The hosted file_search tool on the engine's own vector stores (openai/file_search.py)."""
    model_config = _config
    type: Literal["file_search"]
    vector_store_ids: list[Annotated[str, Field(max_length=64)]] = Field(..., min_length=1, max_length=16)
    max_num_results: int = Field(5, ge=1, le=50)
    filters: dict | None = None
    ranking_options: dict | None = None  # accepted; the ranking is Ember's hybrid one


class NamedFunctionChoice(BaseModel):
    model_config = _config
    type: Literal["function"]
    name: str = Field(..., max_length=64)


class TextFormat(BaseModel):
    model_config = _config
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str = Field("response", pattern=FUNCTION_NAME)
    schema_: dict | bool | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(BaseModel):
    model_config = _config
    format: TextFormat | None = None


class ResponsesRequest(BaseModel):
    model_config = _config
    model: str | None = model_field
    input: str | list[FunctionCallItem | FunctionCallOutputItem | MessageItem] = Field(..., min_length=1)
    instructions: str | None = None
    tools: list[Annotated[FunctionTool | FileSearchTool, Field(discriminator="type")]] | None = Field(
        None, max_length=128)
    include: list[str] | None = Field(None, max_length=16)  # "file_search_call.results" is the one read
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    temperature: float = temperature_field
    top_p: float = top_p_field
    seed: int | None = seed_field
    max_output_tokens: int | None = max_tokens_field
    stream: bool = False
    previous_response_id: str | None = Field(None, max_length=256)
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = Field(None, max_length=256)

    @property
    def functions(self) -> list[FunctionTool]:
        return [t for t in self.tools or () if isinstance(t, FunctionTool)]

    @property
    def file_search(self) -> FileSearchTool | None:
        return next((t for t in self.tools or () if isinstance(t, FileSearchTool)), None)

    def to_chat(self) -> ChatCompletionRequest:
        """The same request as a chat completion; its validation errors are this request's 400s."""
        if self.previous_response_id:
            raise APIError(400, "previous_response_id is not supported: this server keeps no responses; "
                           "send the conversation so far as `input` items", param="previous_response_id",
                           code="unsupported_parameter")
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        items = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        named = []  # (message index, input item's name) of the messages that carry images
        for k, item in enumerate(items):
            if isinstance(item, MessageItem):
                if item.has_images:
                    named.append((len(messages), f"input[{k}]"))
                messages.append({"role": item.role, "content": item.chat_content(f"input[{k}]")})
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}
                last = messages[-1] if messages else None
                if last and last["role"] == "assistant" and last.get("tool_calls") and not last["content"]:
                    last["tool_calls"].append(call)  # parallel calls: one assistant turn
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            else:
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        choice = self.tool_choice
        fmt = self.text.format if self.text else None
        chat = {
            "model": self.model, "messages": messages, "temperature": self.temperature, "top_p": self.top_p,
            "seed": self.seed, "max_tokens": self.max_output_tokens, "parallel_tool_calls": self.parallel_tool_calls,
            "tools": [{"type": "function", "function": t.model_dump(exclude={"type"})} for t in self.functions] or None,
            "tool_choice": ({"type": "function", "function": {"name": choice.name}}
                            if isinstance(choice, NamedFunctionChoice) else choice),
            "response_format": None if fmt is None else (
                {"type": fmt.type} if fmt.type != "json_schema" else
                {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_,
                                                        "strict": fmt.strict}})}
        try:
            request = ChatCompletionRequest.model_validate(chat)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ()))
            raise APIError(400, f"{where}: {str(err.get('msg')).removeprefix('Value error, ')}".lstrip(": "),
                           param="input", code="invalid_value") from None
        for i, where in named:  # an image's 400 names it as this request holds it
            for j, part in request.messages[i].image_parts:
                part._where = f"{where}.content[{j}]"
        return request
