"""A reasoning model's thinking comes back apart from its answer, over real HTTP with the official
openai client, on both runners: `message.reasoning_content` / `delta.reasoning_content` hold the
`<think>` block, `content` the answer alone, usage counts the thinking's tokens.

The model is scripted (tests/scripted_gguf.py): whatever the prompt, its greedy reply is
`<think>\\thm</think> ok` and the end of the turn; its template is Qwen3-style.
"""
from __future__ import annotations

import openai
import pytest

from gguf_factory import CHATML_TEMPLATE
from scripted_gguf import THINKING_SCRIPT, write_scripted_model
from server_util import openai_client, start_engine

MSGS = [{"role": "user", "content": "Say ok."}]


@pytest.fixture(scope="module", params=["torch", "llama.cpp"])
def server(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("think")
    proc = start_engine(write_scripted_model(d / "thinker.gguf", THINKING_SCRIPT), d, backend=request.param)
    yield proc
    proc.stop()


def _model(server) -> str:
    return server.health()["model"]


def test_reasoning_and_answer_are_split_exactly(server):
    r = openai_client(server).chat.completions.create(model=_model(server), messages=MSGS, temperature=0,
                                                      max_tokens=20, n=2)
    for choice in r.choices:
        assert choice.message.content == "ok"
        assert choice.message.model_extra["reasoning_content"] == "hm"
        assert choice.finish_reason == "stop"
    details = r.usage.completion_tokens_details
    assert r.usage.completion_tokens == 2 * 9  # the script and the end of the turn, twice
    assert details.reasoning_tokens == 2 * 5  # <think>, "\t", "h", "m", </think>: the block, tags included


def test_streamed_reasoning_comes_first_and_equals_the_whole(server):
    stream = openai_client(server).chat.completions.create(
        model=_model(server), messages=MSGS, temperature=0, max_tokens=20, stream=True,
        stream_options={"include_usage": True})
    kinds, reasoning, content, usage = [], "", "", None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            extra = c.delta.model_extra or {}
            if extra.get("reasoning_content"):
                reasoning += extra["reasoning_content"]
                kinds.append("reasoning")
            if c.delta.content:
                content += c.delta.content
                kinds.append("content")
    assert (reasoning, content) == ("hm", "ok")
    assert kinds.index("content") > max(i for i, k in enumerate(kinds) if k == "reasoning")
    assert usage.completion_tokens_details.reasoning_tokens == 5


@pytest.mark.parametrize("how", ["the model's own", "--chat-template"])
def test_a_template_without_thinking_leaves_the_text_alone(tmp_path, how):
    """Reasoning is read from the template in use: the file's, or the one --chat-template gives."""
    if how == "--chat-template":
        (tmp_path / "chatml.jinja").write_text(CHATML_TEMPLATE)
        path, extra = write_scripted_model(tmp_path / "thinker.gguf", THINKING_SCRIPT), ("--chat-template",
                                                                              str(tmp_path / "chatml.jinja"))
    else:
        path, extra = write_scripted_model(tmp_path / "plain.gguf", THINKING_SCRIPT, template=CHATML_TEMPLATE), ()
    proc = start_engine(path, tmp_path, *extra)
    try:
        r = openai_client(proc).chat.completions.create(model=_model(proc), messages=MSGS, temperature=0,
                                                        max_tokens=20)
        assert r.choices[0].message.content == "<think>\thm</think> ok"
        assert "reasoning_content" not in (r.choices[0].message.model_extra or {})
        details = r.usage.completion_tokens_details
        assert details is None or details.reasoning_tokens is None
    finally:
        proc.stop()


def _prompt_tokens(server, **extra) -> int:
    r = openai_client(server).chat.completions.create(model=_model(server), messages=MSGS, temperature=0,
                                                      max_tokens=1, extra_body=extra)
    return r.usage.prompt_tokens


def test_chat_template_kwargs_reach_the_template(server):
    """Qwen3's switch: enable_thinking false renders an empty think block after the prompt."""
    on, off = _prompt_tokens(server), _prompt_tokens(server, chat_template_kwargs={"enable_thinking": False})
    assert off > on and _prompt_tokens(server, chat_template_kwargs={"enable_thinking": True}) == on
    assert _prompt_tokens(server, reasoning_effort="low") == on  # a variable this template does not read


@pytest.mark.parametrize("extra, param", [
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"chat_template_kwargs": "enable_thinking"}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
])
def test_bad_reasoning_switches_are_400s_naming_the_field(server, extra, param):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        openai_client(server).chat.completions.create(model=_model(server), messages=MSGS, max_tokens=1,
                                                      extra_body=extra)
    assert e.value.body["param"] == param


@pytest.mark.parametrize("budget, reasoning", [(2, "\th"), (0, "")])
def test_the_thinking_budget_closes_the_block_and_the_answer_follows(server, budget, reasoning):
    """Past the budget the engine writes </think> itself in place of the next token."""
    r = openai_client(server).chat.completions.create(model=_model(server), messages=MSGS, temperature=0,
                                                      max_tokens=20, extra_body={"max_reasoning_tokens": budget})
    message = r.choices[0].message
    assert message.content == "ok" and (message.model_extra.get("reasoning_content") or "") == reasoning.strip()
    # <think>, the budget's tokens, and the </think> the engine wrote
    assert r.usage.completion_tokens_details.reasoning_tokens == budget + 2


def test_a_negative_budget_is_a_400(server):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        openai_client(server).chat.completions.create(model=_model(server), messages=MSGS, max_tokens=1,
                                                      extra_body={"max_reasoning_tokens": -1})
    assert e.value.body["param"] == "max_reasoning_tokens"


def test_the_server_default_budget_applies_unless_a_request_says(tmp_path):
    proc = start_engine(write_scripted_model(tmp_path / "thinker.gguf", THINKING_SCRIPT), tmp_path,
                        "--max-reasoning-tokens", "1")
    try:
        client = openai_client(proc)
        capped = client.chat.completions.create(model=_model(proc), messages=MSGS, temperature=0, max_tokens=20)
        assert capped.choices[0].message.content == "ok"
        assert capped.usage.completion_tokens_details.reasoning_tokens == 3
        free = client.chat.completions.create(model=_model(proc), messages=MSGS, temperature=0, max_tokens=20,
                                              extra_body={"max_reasoning_tokens": 100})
        assert free.choices[0].message.model_extra["reasoning_content"] == "hm"
    finally:
        proc.stop()


def test_ember_generate_prints_the_thinking_apart(tmp_path):
    """Off a terminal the thoughts come after "Thinking: " (dimmed on one), then the answer."""
    import os
    import subprocess
    import sys

    path = write_scripted_model(tmp_path / "thinker.gguf", THINKING_SCRIPT)
    env = {**os.environ, "EMBER_HOME": str(tmp_path / "home")}
    (tmp_path / "chatml.jinja").write_text(CHATML_TEMPLATE)
    for flags, want in (([], "Thinking: hm\n\nok\n"), (["--raw"], "<think>\thm</think> ok\n"),
                        (["--chat-template", str(tmp_path / "chatml.jinja")], "<think>\thm</think> ok\n")):
        r = subprocess.run([sys.executable, "-m", "app", "generate", "--model", str(path), "--max-tokens", "20",
                            "--threads", "1", *flags, "Say ok."], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout == want


def test_ollama_clients_get_the_thinking_in_its_field(server):
    """Ollama's /api/chat: message.thinking and message.content, streamed and not; think=false
    reaches the template (its prompt grows by the empty block)."""
    import ollama

    client = ollama.Client(host=server.base_url, headers=server.headers)
    name = _model(server)
    r = client.chat(model=name, messages=MSGS, options={"temperature": 0, "num_predict": 20})
    assert (r.message.thinking, r.message.content) == ("hm", "ok")
    parts = list(client.chat(model=name, messages=MSGS, options={"temperature": 0, "num_predict": 20}, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == "hm"
    assert "".join(p.message.content for p in parts) == "ok"
    off = client.chat(model=name, messages=MSGS, think=False, options={"temperature": 0, "num_predict": 1})
    on = client.chat(model=name, messages=MSGS, think=True, options={"temperature": 0, "num_predict": 1})
    assert off.prompt_eval_count > on.prompt_eval_count
    g = client.generate(model=name, prompt="Say ok.", options={"temperature": 0, "num_predict": 20})
    assert (g.thinking, g.response) == ("hm", "ok")
    assert "thinking" in client.show(name).capabilities


def test_the_responses_api_returns_a_reasoning_item_before_the_message(server):
    client = openai_client(server)
    r = client.responses.create(model=_model(server), input="Say ok.", temperature=0, max_output_tokens=20)
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning", "message"] and r.output_text == "ok"
    assert r.output[0].content[0].text == "hm"
    assert r.usage.output_tokens_details.reasoning_tokens == 5
    events = list(client.responses.create(model=_model(server), input="Say ok.", temperature=0,
                                          max_output_tokens=20, stream=True))
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    answer = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thought, answer) == ("hm", "ok")
    done = [e.item.type for e in events if e.type == "response.output_item.done"]
    assert done == ["reasoning", "message"]
    assert events[-1].type == "response.completed" and events[-1].response.output_text == "ok"


def test_anthropic_clients_get_a_thinking_block_and_its_budget(server):
    import anthropic

    client = anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, max_retries=0)
    kw = dict(model=_model(server), max_tokens=20, messages=[{"role": "user", "content": "Say ok."}],
              extra_body={"temperature": 0})
    m = client.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert (m.content[0].thinking, m.content[1].text) == ("hm", "ok")
    with client.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[0].thinking == "hm"
    capped = client.messages.create(**kw, thinking={"type": "enabled", "budget_tokens": 0})
    assert [b.type for b in capped.content] == ["text"] and capped.content[0].text == "ok"


def test_a_json_schema_request_thinks_first_then_the_grammar_holds(server, tmp_path):
    """llama.cpp's lazy grammar: the first token may open the think block; inside it nothing is
    masked; from </think> on the grammar holds, so the content is the schema's JSON. Streamed, the
    thinking comes first; with a budget, the engine's own </think> starts the grammar."""
    import json

    import jsonschema

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    client = openai_client(server)
    r = client.chat.completions.create(model=_model(server), messages=MSGS, temperature=0, max_tokens=40,
                                       response_format=fmt)
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    assert r.choices[0].message.model_extra["reasoning_content"] == "hm"
    chunks = list(client.chat.completions.create(model=_model(server), messages=MSGS, temperature=0, max_tokens=40,
                                                 response_format=fmt, stream=True))
    thought = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                      for c in chunks if c.choices)
    answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert (thought, answer) == ("hm", r.choices[0].message.content)
    capped = client.chat.completions.create(model=_model(server), messages=MSGS, temperature=0, max_tokens=40,
                                            response_format=fmt, extra_body={"max_reasoning_tokens": 2})
    assert capped.choices[0].message.model_extra["reasoning_content"] == "h"  # "\th", then the budget's </think>
    jsonschema.validate(json.loads(capped.choices[0].message.content), schema)


def test_a_template_that_opens_the_block_in_the_prompt(tmp_path):
    """DeepSeek-R1 distills' templates end the prompt inside <think>: the reply is thoughts up to
    </think>, then the answer; with a grammar, the thoughts are free and the answer is held."""
    import json

    r1 = CHATML_TEMPLATE.replace("{{ '<|im_start|>assistant\\n' }}", "{{ '<|im_start|>assistant\\n<think>\\n' }}")
    assert r1 != CHATML_TEMPLATE
    path = write_scripted_model(tmp_path / "r1.gguf", ["h", "m", "</think>", "Ġ", "o", "k"], template=r1)
    proc = start_engine(path, tmp_path)
    try:
        client = openai_client(proc)
        r = client.chat.completions.create(model=_model(proc), messages=MSGS, temperature=0, max_tokens=20)
        assert (r.choices[0].message.model_extra["reasoning_content"], r.choices[0].message.content) == ("hm", "ok")
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                  "additionalProperties": False}
        j = client.chat.completions.create(
            model=_model(proc), messages=MSGS, temperature=0, max_tokens=40,
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
        assert isinstance(json.loads(j.choices[0].message.content)["ok"], bool)
        assert j.choices[0].message.model_extra["reasoning_content"] == "hm"
    finally:
        proc.stop()


@pytest.mark.parametrize("backend", ["torch", "llama.cpp"])
def test_harmony_channels_split_into_reasoning_and_answer(tmp_path, backend):
    """gpt-oss's harmony format: the analysis channel is the reasoning, the final channel the
    answer. Its markup is control tokens, which the detokenizer writes for such a model so the
    parser can read them; none of it reaches either field, streamed or not."""
    from scripted_gguf import HARMONY_TEMPLATE

    script = ["h", "m", "<|end|>", "<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "o", "k",
              "<|return|>"]
    path = write_scripted_model(tmp_path / "harmony.gguf", script, template=HARMONY_TEMPLATE, harmony=True)
    proc = start_engine(path, tmp_path, backend=backend)
    try:
        client = openai_client(proc)
        r = client.chat.completions.create(model=_model(proc), messages=MSGS, temperature=0, max_tokens=20)
        message = r.choices[0].message
        assert (message.model_extra["reasoning_content"], message.content) == ("hm", "ok")
        chunks = list(client.chat.completions.create(model=_model(proc), messages=MSGS, temperature=0,
                                                     max_tokens=20, stream=True))
        thought = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                          for c in chunks if c.choices)
        assert (thought, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)) == ("hm", "ok")
        raw = client.completions.create(model=_model(proc), prompt="x", temperature=0, max_tokens=20)
        # a plain completion is the raw reply: llama.cpp itself renders harmony's markup tokens
        assert raw.choices[0].text == "hm<|end|><|start|>assistant<|channel|>final<|message|>ok"
    finally:
        proc.stop()


@pytest.mark.parametrize("backend", ["torch", "llama.cpp"])
def test_a_required_tool_call_after_thinking_parses(tmp_path, backend):
    """tool_choice "required": the model thinks first, then the call's grammar holds, and the call
    parses from the answer (the reasoning is not searched for calls)."""
    import json

    from scripted_gguf import THINKING_TOOLS_TEMPLATE

    path = write_scripted_model(tmp_path / "tools.gguf", THINKING_SCRIPT, template=THINKING_TOOLS_TEMPLATE)
    proc = start_engine(path, tmp_path, backend=backend)
    try:
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            "required": ["city"], "additionalProperties": False}}}]
        r = openai_client(proc).chat.completions.create(model=_model(proc), messages=MSGS, temperature=0,
                                                        max_tokens=200, tools=tools, tool_choice="required")
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.model_extra["reasoning_content"] == "hm"
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
    finally:
        proc.stop()


@pytest.mark.parametrize("backend", ["torch", "llama.cpp"])
def test_a_harmony_tool_call_parses_from_its_message_to_the_function(tmp_path, backend):
    """gpt-oss calls a tool with a commentary message addressed `to=functions.NAME`, ending in
    <|call|>: the call parses, its arguments are the message, and neither field holds it."""
    from scripted_gguf import HARMONY_TEMPLATE

    template = ("{% if tools %}<|start|>developer<|message|>Tools: {% for t in tools %}{{ t.function.name }} "
                "{% endfor %}(call one as to=functions.NAME, then <|call|>)<|end|>{% endif %}") + HARMONY_TEMPLATE
    script = ["h", "m", "<|end|>", "<|start|>", "assistant", "<|channel|>", "commentary",
              " to=functions.get_weather", "<|message|>", "{", "}", "<|call|>"]
    path = write_scripted_model(tmp_path / "oss-tools.gguf", script, template=template, harmony=True)
    proc = start_engine(path, tmp_path, backend=backend)
    try:
        client = openai_client(proc)
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                                                                                        "properties": {}}}}]
        r = client.chat.completions.create(model=_model(proc), messages=MSGS, temperature=0, max_tokens=30,
                                           tools=tools)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.model_extra["reasoning_content"] == "hm"
        (call,) = choice.message.tool_calls
        assert (call.function.name, call.function.arguments, choice.message.content) == ("get_weather", "{}", None)
        chunks = list(client.chat.completions.create(model=_model(proc), messages=MSGS, temperature=0,
                                                     max_tokens=30, tools=tools, stream=True))
        streamed = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        assert [tc.function.name for tc in streamed] == ["get_weather"]
        assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=_model(proc), messages=MSGS, tools=tools, tool_choice="required")
    finally:
        proc.stop()


def test_a_reply_cut_while_thinking_continues_where_it_stopped(server):
    client = openai_client(server)
    cut = client.chat.completions.create(model=_model(server), messages=MSGS, temperature=0, max_tokens=3)
    choice = cut.choices[0]
    thought = choice.message.model_extra["reasoning_content"]
    assert choice.finish_reason == "length" and not choice.message.content and thought == "h"  # stripped as in "hm"
    so_far = {"role": "assistant", "content": "", "reasoning_content": thought}
    rest = client.chat.completions.create(model=_model(server), messages=[*MSGS, so_far], temperature=0,
                                          max_tokens=20, extra_body={"continue_final_message": True})
    # the thoughts go on from the last token written (the script's next one), then the answer
    assert rest.choices[0].message.model_extra["reasoning_content"] == "m"
    assert rest.choices[0].message.content == "ok" and rest.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError, match="continue_final_message"):
        client.chat.completions.create(model=_model(server), messages=MSGS, max_tokens=2,
                                       extra_body={"continue_final_message": True})
