"""Reasoning under the real chat templates (tests/data/chat_templates: Qwen3, a DeepSeek-R1 distill,
SmolLM3, gpt-oss), over real HTTP with the openai client, on scripted models (tests/scripted_gguf.py) whose
greedy reply is a fixed thinking block and answer: the split is exact, `enable_thinking: false`
and `reasoning_effort` reach the rendered prompt, a JSON schema and a required tool call hold after
the thinking, and the second turn's prompt is exactly what the template renders.

Oracles we did not write: the templates themselves (rendered by Ember's sandboxed Jinja), the
llama.cpp tokenizer counting the rendered prompt, jsonschema, the openai client.
"""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from scripted_gguf import write_scripted_model
from server_util import openai_client, start_engine

from engine.loaders.chat_template import ChatTemplate
from engine.loaders.tokenizer import Tokenizer

pytestmark = pytest.mark.slow
TEMPLATES = Path(__file__).parents[1] / "data" / "chat_templates"
MSGS = [{"role": "user", "content": "Say ok."}]


def _template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3")
    path = write_scripted_model(d / "qwen3.gguf", ["<think>", "ĉ", "h", "m", "</think>", "Ġ", "o", "k"],
                                template=_template("qwen3"), ctx=2048)  # its tools prompt is long here
    proc = start_engine(path, d)
    proc.path = path
    yield proc
    proc.stop()


def _chat(proc, messages=MSGS, **kw):
    return openai_client(proc).chat.completions.create(model=proc.health()["model"], messages=messages,
                                                       temperature=0, **{"max_tokens": 40, **kw})


def test_qwen3_splits_exactly_and_its_switch_reaches_the_template(qwen3):
    r = _chat(qwen3)
    assert (r.choices[0].message.model_extra["reasoning_content"], r.choices[0].message.content) == ("hm", "ok")
    off = _chat(qwen3, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    tok = Tokenizer(qwen3.path)
    added = len(tok.encode("<think>\n\n</think>\n\n", add_bos=False))
    assert off.usage.prompt_tokens == r.usage.prompt_tokens + added  # the template's empty block
    status = openai_client(qwen3).get("/engine/status", cast_to=object)
    assert status["thinking"] == {"format": "think_tags", "switch": True, "effort": False}


def test_qwen3_second_turn_prompt_is_what_the_template_renders(qwen3):
    turns = MSGS + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "Again."}]
    r = _chat(qwen3, messages=turns)
    rendered = ChatTemplate(_template("qwen3"), "", "").render(turns, add_generation_prompt=True)
    assert "<think>" not in rendered  # an earlier turn's thoughts are not sent back
    assert r.usage.prompt_tokens == len(Tokenizer(qwen3.path).encode(rendered))


def test_qwen3_schema_and_required_tool_hold_after_the_thinking(qwen3):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    j = _chat(qwen3, response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
    assert j.choices[0].message.model_extra["reasoning_content"] == "hm"
    jsonschema.validate(json.loads(j.choices[0].message.content), schema)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        "required": ["city"], "additionalProperties": False}}}]
    t = _chat(qwen3, tools=tools, tool_choice="required", max_tokens=200)
    assert t.choices[0].finish_reason == "tool_calls" and t.choices[0].message.model_extra["reasoning_content"] == "hm"
    assert t.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_a_deepseek_r1_distill_reply_starts_inside_the_block(tmp_path):
    path = write_scripted_model(tmp_path / "r1.gguf", ["h", "m", "</think>", "Ġ", "o", "k"],
                                template=_template("deepseek-r1-distill"))
    proc = start_engine(path, tmp_path)
    try:
        r = _chat(proc)
        assert (r.choices[0].message.model_extra["reasoning_content"], r.choices[0].message.content) == ("hm", "ok")
        chunks = list(openai_client(proc).chat.completions.create(model=proc.health()["model"], messages=MSGS,
                                                                  temperature=0, max_tokens=40, stream=True))
        thought = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                          for c in chunks if c.choices)
        assert (thought, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)) == ("hm", "ok")
    finally:
        proc.stop()


def test_smollm3_splits_and_no_think_in_the_system_prompt_is_its_switch(tmp_path):
    path = write_scripted_model(tmp_path / "smollm3.gguf", ["<think>", "ĉ", "h", "m", "</think>", "Ġ", "o", "k"],
                                template=_template("smollm3"), ctx=2048)
    proc = start_engine(path, tmp_path)
    try:
        r = _chat(proc)
        assert (r.choices[0].message.model_extra["reasoning_content"], r.choices[0].message.content) == ("hm", "ok")
        template, tok = ChatTemplate(_template("smollm3"), "", ""), Tokenizer(path)
        off = _chat(proc, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        rendered = template.render(MSGS, add_generation_prompt=True, enable_thinking=False)
        assert rendered.endswith("<think>\n\n</think>\n") and off.usage.prompt_tokens == len(tok.encode(rendered))
        flagged = [{"role": "system", "content": "/no_think"}] + MSGS
        assert template.render(flagged, add_generation_prompt=True).endswith("<think>\n\n</think>\n")
        status = openai_client(proc).get("/engine/status", cast_to=object)
        assert status["thinking"]["switch"] is True
    finally:
        proc.stop()


def test_gpt_oss_is_harmony_and_its_effort_reaches_the_template(tmp_path):
    """gpt-oss's own template: harmony format, an effort choice, and reasoning_effort in its system
    message. (A scripted reply cannot repeat a token, and a whole harmony reply names <|channel|>
    twice: the split itself is tested on its markup in test_reasoning_api.)"""
    path = write_scripted_model(tmp_path / "oss.gguf", ["o", "k"], template=_template("gpt-oss"), harmony=True)
    proc = start_engine(path, tmp_path)
    try:
        status = openai_client(proc).get("/engine/status", cast_to=object)
        assert status["thinking"] == {"format": "harmony", "switch": False, "effort": True}
        low, high = (_chat(proc, reasoning_effort=e, max_tokens=2) for e in ("low", "high"))
        template = ChatTemplate(_template("gpt-oss"), "", "")
        tok = Tokenizer(path)
        for reply, effort in ((low, "low"), (high, "high")):
            rendered = template.render(MSGS, add_generation_prompt=True, reasoning_effort=effort)
            assert f"Reasoning: {effort}" in rendered
            assert reply.usage.prompt_tokens == len(tok.encode(rendered))
    finally:
        proc.stop()
