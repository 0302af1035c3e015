"""Tool calls with the official `openai` client against a real `ember serve` (llama.cpp runner)
on Qwen2.5-Coder-0.5B-Instruct, whose own template renders the tools (Hermes `<tool_call>`):
the round trip (call, result, answer) streamed and not, tool_choice required and named, and
the 400s for tools that cannot work.
"""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from server_util import qwen_server_fixtures

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 40}},
                   "required": ["zone"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


server, client = qwen_server_fixtures(("llama.cpp",), 4096)


def _chat(client, messages, **kw):
    return client.chat.completions.create(model="default", messages=messages, tools=TOOLS,
                                          temperature=0, max_tokens=120, **kw)


def _check_call(call, tool) -> dict:
    assert call.type == "function" and call.id and call.function.name == tool["function"]["name"]
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, tool["function"]["parameters"])
    return args


def _answer_with_result(client, call, **kw):
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id,
                      "content": json.dumps({"temperature": 18, "sky": "sunny"})}]
    return _chat(client, history, **kw)


def test_round_trip(client):
    r = _chat(client, ASK, tool_choice="required")
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    assert _check_call(c.message.tool_calls[0], WEATHER)["city"] == "Paris"
    final = _answer_with_result(client, c.message.tool_calls[0], tool_choice="none")
    assert final.choices[0].finish_reason == "stop" and final.choices[0].message.content
    assert not final.choices[0].message.tool_calls


def test_round_trip_streamed(client):
    chunks = list(_chat(client, ASK, tool_choice="required", stream=True))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    calls = [tc for d in deltas for tc in d.tool_calls or ()]
    assert calls and calls[0].index == 0 and calls[0].id and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments)["city"] == "Paris"
    assert not "".join(d.content or "" for d in deltas)
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
    whole = _chat(client, ASK, tool_choice="required").choices[0].message.tool_calls[0]
    assert whole.function.arguments == calls[0].function.arguments  # streamed = not streamed
    text = "".join(ch.choices[0].delta.content or "" for ch in _answer_with_result(
        client, whole, tool_choice="none", stream=True) if ch.choices)
    assert text == _answer_with_result(client, whole, tool_choice="none").choices[0].message.content


def test_named_tool_choice_forces_that_function(client):
    r = _chat(client, ASK, tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = r.choices[0].message.tool_calls
    assert len(calls) == 1
    _check_call(calls[0], TIME)


def test_auto_answers_or_calls(client):
    """The model decides; either way the reply is well formed (a parsed call validates)."""
    c = _chat(client, ASK, tool_choice="auto").choices[0]
    if c.message.tool_calls:
        assert c.finish_reason == "tool_calls"
        _check_call(c.message.tool_calls[0], WEATHER)
    else:
        assert c.finish_reason in ("stop", "length") and c.message.content


@pytest.mark.parametrize("kw, needle", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "obj"}}}]}, "parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}, "parameters"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "name"),
    ({"tools": [WEATHER, WEATHER]}, "unique"),
    ({"messages": ASK + [{"role": "tool", "tool_call_id": "call_x", "content": "18C"}]}, "call_x"),
    ({"messages": ASK + [{"role": "tool", "content": "18C"}]}, "tool_call_id"),
])
def test_bad_tools_are_400s(client, kw, needle):
    args = {"model": "default", "messages": ASK, "tools": TOOLS, "max_tokens": 4, **kw}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**args)
    assert needle in e.value.message
    assert client.chat.completions.create(model="default", messages=ASK, max_tokens=2).choices  # still serving
