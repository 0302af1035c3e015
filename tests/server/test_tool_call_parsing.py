"""Tool-call syntax per template family: chosen from the template text, parsed from replies,
held back while streaming, and forced by a grammar that accepts exactly such calls."""
from __future__ import annotations

import json

import llguidance
import pytest

from engine.loaders.chat_template import ChatTemplate
from engine.model_files.tool_call_syntax import ToolFormat, may_start_call, parse_tool_calls, tool_format
from engine.server.tool_calls import forced_call_grammar
from engine.server.tool_protocol import Tool

QWEN_LIKE = "{% if tools %}<tools>{{ tools | tojson }}</tools> reply in <tool_call></tool_call>{% endif %}"
MISTRAL_LIKE = "{% if tools %}[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]"
LLAMA_LIKE = ("<|start_header_id|>{% if tools %}Respond with {\"name\": function name, \"parameters\": "
              "dictionary}{{ tools }}{% endif %}<|eot_id|>")


@pytest.mark.parametrize("src, fmt", [(QWEN_LIKE, ToolFormat.HERMES), (MISTRAL_LIKE, ToolFormat.MISTRAL),
                                      (LLAMA_LIKE, ToolFormat.LLAMA3), ("{{ messages }}", None),
                                      ("<tool_call> without the variable", None)])
def test_family_from_the_template_text(src, fmt):
    assert tool_format(src) is fmt


def test_bundled_template_has_no_tool_support(bundled_model_path):
    assert tool_format(ChatTemplate.from_gguf(bundled_model_path).source) is None


def test_hermes_calls_and_content():
    text = ('Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>')
    content, calls = parse_tool_calls(ToolFormat.HERMES, text)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("a", {"x": 1}), ("b", {})]
    assert len({c.id for c in calls}) == 2
    assert parse_tool_calls(ToolFormat.HERMES, "<tool_call>\n{not json}\n</tool_call>")[1] == []


def test_llama3_and_mistral_calls():
    _, calls = parse_tool_calls(ToolFormat.LLAMA3, '<|python_tag|>{"name": "f", "parameters": {"q": "x"}}')
    assert calls[0].name == "f" and json.loads(calls[0].arguments) == {"q": "x"}
    _, calls = parse_tool_calls(ToolFormat.LLAMA3, '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {}}')
    assert [c.name for c in calls] == ["f", "g"]
    assert parse_tool_calls(ToolFormat.LLAMA3, "Hello {there}") == ("Hello {there}", [])
    content, calls = parse_tool_calls(ToolFormat.MISTRAL, 'ok[TOOL_CALLS][{"name": "f", "arguments": {"a": 2}}]')
    assert content == "ok" and json.loads(calls[0].arguments) == {"a": 2}


def test_streaming_holds_back_what_may_be_a_call():
    assert may_start_call(ToolFormat.HERMES, "Sure, <tool_") == len("Sure, ")
    assert may_start_call(ToolFormat.HERMES, "a < b") == len("a < b")
    assert may_start_call(ToolFormat.HERMES, "x <tool_call>{") == 2
    assert may_start_call(ToolFormat.LLAMA3, ' {"name"') == 0
    assert may_start_call(ToolFormat.LLAMA3, "Hi") == 2


def _tool(name: str, params: dict) -> Tool:
    return Tool.model_validate({"type": "function", "function": {"name": name, "parameters": params}})


@pytest.mark.parametrize("fmt, good, bad", [
    (ToolFormat.HERMES, '<tool_call>\n{"name": "f", "arguments": {"n": 3}}\n</tool_call>',
     '<tool_call>\n{"name": "g", "arguments": {"n": 3}}\n</tool_call>'),
    (ToolFormat.LLAMA3, '{"name": "f", "parameters": {"n": 3}}', '{"name": "f", "parameters": {"n": "3"}}'),
])
def test_forced_grammar_accepts_only_valid_calls(fmt, good, bad):
    tools = [_tool("f", {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})]
    source = forced_call_grammar(fmt, tools, parallel=False, special_id=lambda t: 0)
    tok = llguidance.LLTokenizer("byte")  # one token per byte: checks the text, not a vocabulary
    for text, ok in ((good, True), (bad, False)):
        m = llguidance.LLMatcher(tok, source, log_level=0)
        ids = tok.tokenize_str(text)
        assert (m.try_consume_tokens(ids) == len(ids) and m.is_accepting()) is ok, text


def test_harmony_calls_are_read_from_the_raw_reply():
    from engine.model_files.tool_call_syntax import ToolFormat, parse_tool_calls, tool_format

    assert tool_format("{% if tools %}...to=functions.{{ name }}...<|call|>{% endif %}") is ToolFormat.HARMONY
    raw = ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
           'to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}')
    _, (call,) = parse_tool_calls(ToolFormat.HARMONY, raw)
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Oslo"}')
    assert parse_tool_calls(ToolFormat.HARMONY, raw[:-3]) == (raw[:-3], [])  # arguments cut short: no call
    assert parse_tool_calls(ToolFormat.HARMONY, "<|channel|>final<|message|>hi")[1] == []


def test_hermes_models_that_fence_their_call_are_read_as_llama_cpp_reads_them():
    """Qwen2.5-Coder answers a tools prompt with the call in a ```json fence or bare, not in <tool_call>:
    read for a name among the request's tools only, so an example object in an answer stays text."""
    names = frozenset({"lookup"})
    fenced = 'Sure.\n```json\n{\n  "name": "lookup",\n  "arguments": {"key": "a"}\n}\n```'
    content, (call,) = parse_tool_calls(ToolFormat.HERMES, fenced, names)
    assert (content, call.name, json.loads(call.arguments)) == ("Sure.", "lookup", {"key": "a"})
    _, (call,) = parse_tool_calls(ToolFormat.HERMES, ' {"name": "lookup", "arguments": {"key": "b"}}', names)
    assert json.loads(call.arguments) == {"key": "b"}
    for text in (fenced, '```json\n{"name": "other", "arguments": {}}\n```', '```python\nprint(1)\n```'):
        assert parse_tool_calls(ToolFormat.HERMES, text, frozenset({"x"})) == (text, [])
    assert parse_tool_calls(ToolFormat.HERMES, fenced) == (fenced, [])  # no tools named: nothing loose


def test_streamed_text_holds_back_only_what_may_still_become_a_fenced_call():
    for text, safe in (("Here:\n```", 6), ("Here:\n```js", 6), ('```json\n{\n  "na', 0), (' {"name"', 1),
                       ("```python\nprint(1)", 18), ("```\ndef f", 9), ("a `b` c", 7), ('{"x": 1}', 8)):
        assert may_start_call(ToolFormat.HERMES, text) == safe, text
