"""The scripted tool-calling model (tests/scripted_gguf.py `write_tool_model`) behaves as the tests of
issue 64 need, over real HTTP with the official openai client on both runners: a request with
tools gets its call (name and arguments exactly, finish_reason "tool_calls"); the follow-up with
the call and its `tool` result gets the plain answer, so an agent loop ends. The prompt the server
renders holds the result in Qwen2.5's <tool_response> block and ends in the answer marker."""
from __future__ import annotations

import json

import pytest

from engine.loaders.chat_template import ChatTemplate
from engine.model_files.tool_call_syntax import ToolFormat, tool_format
from engine.server.openai.protocol import ChatCompletionRequest
from mcp_test_server import lookup_value
from scripted_gguf import ANSWER_MARKER, TOOL_ANSWER, tool_call_text, write_tool_model
from server_util import openai_client, start_engine

CALL = {"name": "lookup", "arguments": {"key": "door"}}
RESULT = lookup_value("door")
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look up the value stored under a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}]
QUESTION = {"role": "user", "content": "What is stored under door?"}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_tool_model(tmp_path_factory.mktemp("tool") / "tool.gguf", CALL)


@pytest.fixture(scope="module", params=["torch", "llama.cpp"])
def server(request, model_path, tmp_path_factory):
    proc = start_engine(model_path, tmp_path_factory.mktemp("srv"), backend=request.param)
    yield proc
    proc.stop()


def ask(server, messages: list[dict], **kw):
    return openai_client(server).chat.completions.create(
        model=server.health()["model"], messages=messages, tools=TOOLS, temperature=0, max_tokens=64, **kw)


def follow_up(call_message) -> list[dict]:
    """The conversation after the call: the assistant's message as the API gave it, then the result."""
    (tc,) = call_message.tool_calls
    return [QUESTION, call_message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": tc.id, "content": RESULT}]


def test_a_request_with_tools_gets_the_scripted_call(server):
    choice = ask(server, [QUESTION]).choices[0]
    assert choice.finish_reason == "tool_calls"
    (tc,) = choice.message.tool_calls
    assert tc.type == "function" and tc.id
    assert (tc.function.name, json.loads(tc.function.arguments)) == (CALL["name"], CALL["arguments"])
    assert tc.function.arguments == json.dumps(CALL["arguments"])
    assert not choice.message.content


def test_the_tool_result_gets_the_answer(server, model_path):
    first = ask(server, [QUESTION]).choices[0].message
    r = ask(server, follow_up(first))
    choice = r.choices[0]
    assert (choice.message.content, choice.finish_reason) == (TOOL_ANSWER, "stop")
    assert not choice.message.tool_calls
    # the prompt the server used is the one rendered below, token for token
    assert r.usage.prompt_tokens == len(prompt_ids(model_path, follow_up(first)))


def test_streamed_call_then_answer(server):
    stream = ask(server, [QUESTION], stream=True)
    calls, finish = {}, None
    for chunk in stream:
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += (d.function.name or "") if d.function else ""
                entry["arguments"] += (d.function.arguments or "") if d.function else ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [(CALL["name"], CALL["arguments"])]
    first = ask(server, [QUESTION]).choices[0].message
    text = "".join(c.delta.content or "" for chunk in ask(server, follow_up(first), stream=True) for c in chunk.choices)
    assert text == TOOL_ANSWER


def rendered(path, messages: list[dict]) -> str:
    """The prompt as the server renders it (engine/server/chat.py render_prompt, the tools as
    engine/server/structured.py hands them to the template)."""
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": messages, "tools": TOOLS})
    tools = [{"type": "function", "function": t.function.template_dict()} for t in body.tools]
    return ChatTemplate.from_gguf(path).render([m.as_template_dict() for m in body.messages],
                                               add_generation_prompt=True, tools=tools)


def prompt_ids(path, messages: list[dict]) -> list[int]:
    """The rendered prompt's tokens, by llama.cpp's tokenizer (the oracle for both runners)."""
    from llama_cpp import Llama

    vocab = Llama(str(path), vocab_only=True, verbose=False)
    return vocab.tokenize(rendered(path, messages).encode(), add_bos=False, special=True)


def test_the_prompt_holds_the_result_in_the_templates_tool_format(model_path):
    assert tool_format(ChatTemplate.from_gguf(model_path).source) is ToolFormat.HERMES
    question = rendered(model_path, [QUESTION])
    assert '<tools>\n{"type": "function", "function": {"name": "lookup", "parameters": ' in question
    assert question.endswith("<|im_start|>user\nWhat is stored under door?<|im_end|>\n<|im_start|>assistant\n")
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "door"}'}}]}
    prompt = rendered(model_path, [QUESTION, call, {"role": "tool", "tool_call_id": "call_1", "content": RESULT}])
    assert prompt.endswith(f"<|im_start|>assistant\n{tool_call_text(CALL)}<|im_end|>\n"
                           f"<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>\n"
                           f"<|im_start|>assistant\n{ANSWER_MARKER}")


@pytest.mark.parametrize("calls", [None, [CALL, {"name": "add", "arguments": {"a": 2, "b": 40}}]],
                         ids=["no call", "two calls"])
def test_no_call_answers_at_once_and_two_calls_come_as_two(tmp_path, calls):
    proc = start_engine(write_tool_model(tmp_path / "tool.gguf", calls), tmp_path)
    try:
        choice = ask(proc, [QUESTION]).choices[0]
    finally:
        proc.stop()
    if calls is None:
        assert (choice.message.content, choice.finish_reason, choice.message.tool_calls) == (TOOL_ANSWER, "stop", None)
    else:
        assert choice.finish_reason == "tool_calls"
        assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
            (c["name"], c["arguments"]) for c in calls]
