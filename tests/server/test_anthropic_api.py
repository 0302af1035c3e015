"""Anthropic's Messages API (/v1/messages) through the official `anthropic` client against a real
engine process, and the tool-call translation on its own.

Oracles we did not write: the `anthropic` client's parsing of every response, stream event and
error, and the engine's own greedy decoding on /v1/chat/completions (the same request through
Anthropic's API must give the same text, streamed or not).
"""
from __future__ import annotations

import json

import httpx
import openai
import pytest
from server_util import start_engine, tiny_model

from engine.outputs import RequestOutput
from engine.model_files.tool_call_syntax import ToolFormat
from engine.server.anthropic.protocol import MessagesRequest, openai_messages, openai_tools
from engine.server.anthropic.routes import _Reply
from engine.server.chat import ChatChoice, ChatRun
from engine.server.errors import APIError

anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.slow

MSGS = [{"role": "user", "content": "Hello, how are you today?"}]
# the client (2.x) no longer has sampler arguments; the API still takes them
GREEDY = {"extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def server(tiny_model_factory, tmp_path_factory):
    proc = start_engine(tiny_model(tiny_model_factory), tmp_path_factory.mktemp("srv"))
    yield proc
    proc.stop()


@pytest.fixture()
def client(server):
    # api_key goes out as x-api-key, which the server takes as its key (auth.py)
    return anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, max_retries=0, timeout=120)


def _reference(server, max_tokens: int, **kw):
    oa = openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0)
    return oa.chat.completions.create(model="default", messages=MSGS, max_tokens=max_tokens, temperature=0, **kw)


def _sse(server, body: dict) -> list[tuple[str, dict]]:
    """(event name, data) pairs of a raw stream, its framing checked."""
    headers = {"x-api-key": server.api_key, "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", server.base_url + "/v1/messages", json=body | {"stream": True},
                      headers=headers, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    events = []
    for frame in text.strip("\n").split("\n\n"):
        name_line, data_line = frame.split("\n")
        events.append((name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))))
        assert name_line.startswith("event: ") and events[-1][1]["type"] == events[-1][0]
    return events


def test_create_and_stream_equal_openai(client, server):
    ref = _reference(server, 12)
    m = client.messages.create(model="default", max_tokens=12, messages=MSGS, **GREEDY)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == ref.choices[0].message.content
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[ref.choices[0].finish_reason]
    assert m.usage.input_tokens == ref.usage.prompt_tokens and m.usage.output_tokens == ref.usage.completion_tokens
    with client.messages.stream(model="default", max_tokens=12, messages=MSGS, **GREEDY) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == m.content[0].text and final.content[0].text == m.content[0].text
    assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens
    assert final.usage.input_tokens == m.usage.input_tokens
    events = _sse(server, {"model": "default", "max_tokens": 12, "temperature": 0, "messages": MSGS})
    names = [n for n, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert events[2][1]["content_block"] == {"type": "text", "text": ""}
    assert "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta") == m.content[0].text
    assert events[-2][1]["delta"]["stop_reason"] == m.stop_reason


def test_max_tokens_and_stop_sequences(client):
    m = client.messages.create(model="default", max_tokens=4, messages=MSGS, **GREEDY)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 4 and m.stop_sequence is None
    full = client.messages.create(model="default", max_tokens=12, messages=MSGS, **GREEDY).content[0].text
    k = next(i for i in range(1, len(full) - 1) if full.find(full[i:i + 2]) == i and full[i:i + 2].strip())
    stop = full[k:k + 2]
    m = client.messages.create(model="default", max_tokens=12, messages=MSGS, **GREEDY,
                               stop_sequences=["@@never@@", stop])
    assert m.content[0].text == full[:k] and m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    with client.messages.stream(model="default", max_tokens=12, messages=MSGS, **GREEDY,
                                stop_sequences=[stop]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop
    # far more than the context holds (an agent's default): clamped to what fits
    m = client.messages.create(model="default", max_tokens=100_000, messages=MSGS, **GREEDY,
                               stop_sequences=[stop])
    assert m.stop_reason == "stop_sequence" and m.content[0].text == full[:k]


def test_count_tokens_and_system(client):
    base = client.messages.count_tokens(model="default", messages=MSGS).input_tokens
    m = client.messages.create(model="default", max_tokens=1, messages=MSGS, **GREEDY)
    assert base == m.usage.input_tokens
    as_str = client.messages.count_tokens(model="default", messages=MSGS, system="You are terse.").input_tokens
    as_blocks = client.messages.count_tokens(model="default", messages=MSGS, system=[
        {"type": "text", "text": "You are"}, {"type": "text", "text": "terse."}]).input_tokens
    assert as_str > base and as_blocks > base and as_blocks != as_str  # blocks joined by a blank line
    m = client.messages.create(model="default", max_tokens=1, messages=MSGS, **GREEDY, system="You are terse.")
    assert m.usage.input_tokens == as_str
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, {
                   "type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                            {"type": "text", "text": "And so?"}]}]
    assert client.messages.count_tokens(model="default", messages=history).input_tokens > base


def test_errors_in_anthropics_shape(client, server):
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="nope", max_tokens=4, messages=MSGS)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="default", max_tokens=4,
                               messages=[{"role": "user", "content": [image, {"type": "text", "text": "What?"}]}])
    assert e.value.body["error"]["type"] == "invalid_request_error" and "image" in e.value.body["error"]["message"]
    bad_result = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]}]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="default", max_tokens=4, messages=bad_result)
    assert "toolu_x" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):  # the tiny model's template renders no tools
        client.messages.create(model="default", max_tokens=4, messages=MSGS, tools=[
            {"name": "weather", "input_schema": {"type": "object", "properties": {}}}])
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0).messages.create(
            model="default", max_tokens=4, messages=MSGS)
    headers = {"x-api-key": server.api_key}
    r = httpx.post(server.base_url + "/v1/messages", headers=headers, json={"model": "default", "messages": MSGS})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in r.json()["error"]["message"]
    bearer = {"Authorization": f"Bearer {server.api_key}"}  # Ember's own header works too
    r = httpx.post(server.base_url + "/v1/messages/count_tokens", headers=bearer,
                   json={"model": "default", "messages": MSGS})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0


# ---- tool calls, without a model ------------------------------------------------------------------
def test_tools_translate_to_openai():
    body = MessagesRequest.model_validate({
        "model": "m", "max_tokens": 8, "system": [{"type": "text", "text": "Be brief."}],
        "tools": [{"name": "weather", "description": "Weather of a city",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "tool_choice": {"type": "tool", "name": "weather", "disable_parallel_tool_use": True},
        "messages": [{"role": "user", "content": "Paris?"},
                     {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "weather",
                                                        "input": {"city": "Paris"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                   "content": [{"type": "text", "text": "sunny"}]}]}]})
    assert openai_messages(body) == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "toolu_1", "type": "function", "function": {
            "name": "weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}]
    t = openai_tools(body)
    assert t["tool_choice"] == {"type": "function", "function": {"name": "weather"}} and not t["parallel_tool_calls"]
    assert t["tools"][0]["function"]["parameters"]["properties"] == {"city": {"type": "string"}}
    any_tool = MessagesRequest.model_validate(body.model_dump() | {"tool_choice": {"type": "any"}})
    assert openai_tools(any_tool)["tool_choice"] == "required"
    with pytest.raises(APIError, match="server tool"):
        openai_tools(MessagesRequest.model_validate(body.model_dump() | {"tools": [
            {"type": "web_search_20250305", "name": "web_search"}]}))
    with pytest.raises(APIError, match="prefill"):
        openai_messages(MessagesRequest.model_validate(body.model_dump() | {"messages": [
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well,"}]}))


def test_tool_call_reply_as_tool_use_blocks():
    text = 'Let me look.<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'

    def out(new: str, finished: bool) -> RequestOutput:
        return RequestOutput("r-0", [1], new, [1] * 9, text, finished, "stop" if finished else None, 5, 0)

    def reply() -> _Reply:
        run = ChatRun(None, "m", "msg-1", [0] * 5, None, {"r-0": 0}, [ChatChoice(0, ToolFormat.HERMES)])
        return _Reply(run, [])

    r = reply()
    parts = [(text[:12], False), (text[12:40], False), (text[40:], True)]
    events = [e for part, finished in parts for e in r.events(out(part, finished))]
    events += list(r.tail())
    parsed = [json.loads(e.split("\n")[1].removeprefix("data: ")) for e in events]
    assert [p["type"] for p in parsed] == [
        "content_block_start", "content_block_delta", "content_block_stop",  # the text before the call
        "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert parsed[1]["delta"] == {"type": "text_delta", "text": "Let me look."}
    assert parsed[3]["index"] == 1 and parsed[3]["content_block"]["type"] == "tool_use"
    assert json.loads(parsed[4]["delta"]["partial_json"]) == {"city": "Paris"}
    assert parsed[6]["delta"]["stop_reason"] == "tool_use" and parsed[6]["usage"]["output_tokens"] == 9
    r = reply()
    r.add(out(text, True))
    m = r.message()
    assert m["stop_reason"] == "tool_use" and m["content"][0] == {"type": "text", "text": "Let me look."}
    assert m["content"][1]["type"] == "tool_use" and m["content"][1]["input"] == {"city": "Paris"}
