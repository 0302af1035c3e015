"""OpenAI request shapes for tools and structured outputs: function tools, tool_choice,
assistant tool calls in the history, and response_format.

Kept apart from openai/protocol.py (the sampler knobs) because these are what agents send: each schema
is checked for shape here, and for enforceability when it is compiled (engine/grammar.py).
"""
from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)
FUNCTION_NAME = r"^[A-Za-z0-9_.\-]{1,64}$"  # OpenAI's rule for function names


def _schema_object(v):
    if v is not None and not isinstance(v, (dict, bool)):
        raise ValueError("a JSON schema must be an object")
    return v


class FunctionDefinition(BaseModel):
    model_config = _config
    name: str = Field(..., pattern=FUNCTION_NAME)
    description: str | None = Field(None, max_length=8192)
    parameters: dict | None = None
    strict: bool | None = None

    _check_parameters = field_validator("parameters")(classmethod(lambda cls, v: _schema_object(v)))

    def template_dict(self) -> dict:
        d = {"name": self.name, "parameters": self.parameters or {"type": "object", "properties": {}}}
        if self.description:
            d["description"] = self.description
        return d


class Tool(BaseModel):
    model_config = _config
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = _config
    name: str = Field(..., max_length=64)


class NamedToolChoice(BaseModel):
    model_config = _config
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(BaseModel):
    model_config = _config
    name: str = Field(..., max_length=64)
    arguments: str = Field("{}", max_length=1 << 20)  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    model_config = _config
    id: str = Field(..., max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall

    def template_dict(self) -> dict:
        """As HF templates expect it: arguments parsed to an object where they are JSON
        (Qwen's and Llama's templates `tojson` them)."""
        try:
            args = json.loads(self.function.arguments)
        except ValueError:
            args = self.function.arguments
        return {"id": self.id, "type": "function",
                "function": {"name": self.function.name, "arguments": args}}


class JsonSchemaFormat(BaseModel):
    model_config = _config
    name: str = Field("response", pattern=FUNCTION_NAME)
    description: str | None = None
    schema_: dict | bool | None = Field(None, alias="schema")
    strict: bool | None = None

    _check_schema = field_validator("schema_")(classmethod(lambda cls, v: _schema_object(v)))


class ResponseFormat(BaseModel):
    model_config = _config
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format type 'json_schema' needs a json_schema object")
        return self
