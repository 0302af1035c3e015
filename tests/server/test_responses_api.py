"""`client.responses.create` (the official `openai` client) against a real `ember serve`
(llama.cpp runner) on Qwen2.5-Coder-0.5B-Instruct: text and message input, instructions,
text.format json_schema, function tools and their outputs, the streamed event sequence, usage.
"""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from server_util import qwen_server_fixtures

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                          "required": ["city"], "additionalProperties": False}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                           "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"], "additionalProperties": False}


server, client = qwen_server_fixtures(("llama.cpp",), 4096)


def test_text_in_text_out_and_usage(client):
    r = client.responses.create(model="default", input="Say hello in one short sentence.",
                                instructions="You are terse.", temperature=0, max_output_tokens=24)
    assert r.object == "response" and r.status in ("completed", "incomplete") and r.output_text
    assert r.output[0].type == "message" and r.output[0].content[0].type == "output_text"
    assert r.usage.input_tokens > 10 and 0 < r.usage.output_tokens <= 24
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    chat = client.chat.completions.create(model="default", temperature=0, max_tokens=24, messages=[
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello in one short sentence."}])
    assert r.output_text == chat.choices[0].message.content  # the same engine path


def test_json_schema_format(client):
    r = client.responses.create(
        model="default", temperature=0, max_output_tokens=60,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Describe Ann, 31, as JSON."}]}],
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), PERSON)


def test_function_call_round_trip(client):
    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
    r = client.responses.create(model="default", input=ask, tools=[WEATHER], tool_choice="required",
                                temperature=0, max_output_tokens=60)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id
    assert json.loads(calls[0].arguments)["city"] == "Oslo"
    history = ask + [{"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name,
                      "arguments": calls[0].arguments},
                     {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"sky": "rain"}'}]
    final = client.responses.create(model="default", input=history, tools=[WEATHER], tool_choice="none",
                                    temperature=0, max_output_tokens=40)
    assert final.output_text and not [o for o in final.output if o.type == "function_call"]


def test_streamed_events(client):
    kw = dict(model="default", input="Name three colors.", temperature=0, max_output_tokens=20)
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == client.responses.create(**kw).output_text
    done = [e for e in events if e.type == "response.output_text.done"]
    assert done and done[0].text == text and events[-1].response.usage.output_tokens > 0
    call_events = list(client.responses.create(model="default", input="Weather in Rome?", tools=[WEATHER],
                                               tool_choice="required", temperature=0, max_output_tokens=60,
                                               stream=True))
    args = [e for e in call_events if e.type == "response.function_call_arguments.done"]
    assert args and json.loads(args[0].arguments)["city"] == "Rome"


def test_previous_response_id_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="default", input="hi", previous_response_id="resp_123")
    assert e.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="default", input=[{"type": "function_call_output", "call_id": "x", "output": "1"}])
