"""The reasoning parser: exact splits per format (llama.cpp's `--reasoning-format deepseek`
whitespace rules), streaming equal to the whole reply for every way of cutting it into deltas,
and the format read from real-looking chat template excerpts."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings, strategies as st
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.server.reasoning import ReasoningFormat, ReasoningParser, detect_format, split

NONE, THINK, HARMONY = ReasoningFormat.NONE, ReasoningFormat.THINK_TAGS, ReasoningFormat.HARMONY
WS = " \t\n\r\f\v"


def stream(text: str, fmt, starts_in_reasoning=False, cuts=()) -> tuple[str, str, bool]:
    parser = ReasoningParser(fmt, starts_in_reasoning)
    bounds = [0, *sorted(cuts), len(text)]
    reasoning = content = ""
    for a, b in zip(bounds, bounds[1:]):
        r, c = parser.feed(text[a:b])
        reasoning, content = reasoning + r, content + c
    r, c = parser.finish()
    return reasoning + r, content + c, parser.reasoning_open


def reference_think(text: str, starts_in_reasoning: bool) -> tuple[str, str]:
    """llama.cpp's try_parse_reasoning for <think>, written as whole-string operations."""
    m = re.match(r"[ \t\n\r\f\v]*<think>", text)
    if m:
        content, rest = text[:m.end() - len("<think>")], text[m.end():]
    elif starts_in_reasoning:
        content, rest = "", text.lstrip(WS)
    else:
        return "", text
    reasoning = ""
    while True:
        inside, closed, after = rest.partition("</think>")
        reasoning += inside.strip(WS)
        if not closed:
            return reasoning, content
        after = after.lstrip(WS)
        if not after.startswith("<think>"):
            return reasoning, content + after
        rest = after[len("<think>"):]


# --- exact splits ----------------------------------------------------------------------------

@pytest.mark.parametrize("text, starts_in, reasoning, content", [
    ("<think>\nLet me add.\n2+2=4.\n</think>\n\nIt is 4.", False, "Let me add.\n2+2=4.", "It is 4."),
    ("<think>\n\n</think>\n\nHi!", False, "", "Hi!"),                     # Qwen3 no-think block
    ("Hi! No <think> here.", False, "", "Hi! No <think> here."),          # skipped thinking
    ("\n<think>x</think>y", False, "x", "\ny"),                           # leading space is content
    ("<think>\nstill going", False, "still going", ""),                   # budget ran out
    ("Okay, so 2+2.\n</think>\n\n4", True, "Okay, so 2+2.", "4"),        # R1 distill: opened by prompt
    ("<think>\nx\n</think>\n\n4", True, "x", "4"),                        # opened twice: tag consumed
    ("<think>a</think>\n<think>b</think>\nc", False, "ab", "c"),         # consecutive blocks join
    ("<think>a</think>c</think>d", False, "a", "c</think>d"),             # answer is not re-parsed
    ("<thi", False, "", "<thi"),                                         # cut-off tag is text
    ("  answer  ", False, "", "  answer  "),                              # content is not stripped
    ("<think>一步一步想。\n</think>\n答案：４", False, "一步一步想。", "答案：４"),
    ("", False, "", ""),
])
def test_think_tags_split(text, starts_in, reasoning, content):
    assert split(text, THINK, starts_in) == (reasoning, content)
    assert reference_think(text, starts_in) == (reasoning, content)


@pytest.mark.parametrize("text, reasoning, content, is_open", [
    ("<|channel|>analysis<|message|>User asks 2+2.\n<|end|><|start|>assistant<|channel|>final"
     "<|message|>4<|return|>", "User asks 2+2.", "4", False),
    ("<|channel|>final<|message|>Just 4.", "", "Just 4.", False),
    ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary"
     "<|message|>Checking the forecast.<|end|><|start|>assistant to=functions.get_weather"
     "<|channel|>commentary <|constrain|>json<|message|>{\"city\":\"Oslo\"}<|call|>",
     "Need weather.", "Checking the forecast.", False),
    ("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>", "", "", False),
    ("<|channel|>analysis<|message|>Hmm, long", "Hmm, long", "", True),
    ("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b"
     "<|end|><|start|>assistant<|channel|>final<|message|> x <|return|>", "ab", " x ", False),
    ("<|channel|>final<|message|>4<|end|><|start|>assistant<|chan", "", "4", False),  # cut header
    ("Plain text, no harmony.", "", "Plain text, no harmony.", False),
])
def test_harmony_split(text, reasoning, content, is_open):
    assert stream(text, HARMONY) == (reasoning, content, is_open)


def test_harmony_prompt_opened_analysis():
    assert stream("thinking<|end|><|start|>assistant<|channel|>final<|message|>done", HARMONY,
                  starts_in_reasoning=True) == ("thinking", "done", False)


def test_none_is_all_content():
    text = "<think>\nnot special\n</think>\n"
    assert stream(text, NONE, cuts=[3, 9]) == ("", text, False)


def test_reasoning_open():
    assert stream("<think>abc", THINK)[2] is True
    assert stream("<think>abc</think>", THINK)[2] is False
    assert stream("all reasoning", THINK, True)[2] is True
    assert stream("", THINK, True)[2] is True  # opened by the prompt, nothing generated
    assert stream("answer", THINK)[2] is False


def test_holds_back_only_a_possible_tag_and_the_space_before_it():
    parser = ReasoningParser(THINK)
    assert parser.feed("<thi") == ("", "")
    assert parser.feed("nk>\nStep one") == ("Step one", "")
    assert parser.feed(".\n</thi") == (".", "")
    assert parser.reasoning_open
    assert parser.feed("s is not it") == ("\n</this is not it", "")
    assert parser.feed("\n</think>") == ("", "")
    assert not parser.reasoning_open
    assert parser.feed("\n\nAns") == ("", "Ans")
    assert parser.feed("wer <") == ("", "wer <")  # the answer holds nothing back
    assert parser.finish() == ("", "")


def test_finish_flushes_a_cut_tag():
    parser = ReasoningParser(THINK)
    assert parser.feed("<think>x\n</th") == ("x", "")
    assert parser.finish() == ("\n</th", "")
    assert parser.reasoning_open


# --- streaming equals the whole reply --------------------------------------------------------

THINK_PIECES = ["<think>", "</think>", "<thi", "</th", "<", "/", ">", "think", "\n", "\n\n", " ",
                "\t", "a", "b c", "é", "思考", "｜", "<｜Assistant｜>"]
HARMONY_PIECES = ["<|channel|>", "analysis", "final", "commentary", "<|message|>", "<|end|>",
                  "<|return|>", "<|call|>", "<|start|>assistant", " to=functions.f", "<|constrain|>",
                  "json", "<|", "|>", "<|en", "\n", " ", "x", "ß", "答案", "{}"]


@st.composite
def cut_text(draw, pieces):
    text = "".join(draw(st.lists(st.sampled_from(pieces), max_size=14)))
    cuts = draw(st.lists(st.integers(0, len(text)), max_size=8))
    return text, cuts


@settings(max_examples=400, deadline=None)
@given(cut_text(THINK_PIECES), st.booleans())
def test_think_streaming_equals_split_and_reference(case, starts_in):
    text, cuts = case
    reasoning, content, _ = stream(text, THINK, starts_in, cuts)
    assert (reasoning, content) == split(text, THINK, starts_in) == reference_think(text, starts_in)


@settings(max_examples=400, deadline=None)
@given(cut_text(HARMONY_PIECES), st.booleans())
def test_harmony_streaming_equals_split(case, starts_in):
    text, cuts = case
    whole = stream(text, HARMONY, starts_in)
    assert stream(text, HARMONY, starts_in, cuts) == whole
    assert whole[:2] == split(text, HARMONY, starts_in)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.lists(st.integers(0, 40), max_size=6),
       st.sampled_from(list(ReasoningFormat)), st.booleans())
def test_any_text_streams_like_split(text, cuts, fmt, starts_in):
    cuts = [min(c, len(text)) for c in cuts]
    assert stream(text, fmt, starts_in, cuts)[:2] == split(text, fmt, starts_in)


# --- the format from the template and the vocabulary -----------------------------------------

# Short excerpts written for this test; each has the telltale strings of its family's template.
R1_DISTILL = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{% set content = message['content'] %}"
    "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}")
QWEN3 = (
    "{%- for message in messages %}{%- set content = message.content %}"
    "{%- if message.role == 'assistant' and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")
SMOLLM3 = (
    "{%- set reasoning_mode = '/think' -%}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{%- set reasoning_mode = '/no_think' -%}{%- endif -%}"
    "{{- '<|im_start|>system\\n## Metadata\\n\\nReasoning Mode: ' + reasoning_mode + '\\n<|im_end|>\\n' -}}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{%- if reasoning_mode == '/think' -%}"
    "{{- '<|im_start|>assistant\\n' -}}{%- else -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n' -}}{%- endif -%}{%- endif -%}")
GPT_OSS = (
    "{{- '<|start|>system<|message|>You are ChatGPT.\\nReasoning: ' + (reasoning_effort or 'medium')"
    " + '\\n\\n# Valid channels: analysis, commentary, final.<|end|>' -}}"
    "{%- for message in messages -%}{%- if message.role == 'assistant' -%}"
    "{%- if message.thinking -%}{{- '<|start|>assistant<|channel|>analysis<|message|>' + "
    "message.thinking + '<|end|>' -}}{%- endif -%}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + message.content + '<|end|>' -}}"
    "{%- else -%}{{- '<|start|>' + message.role + '<|message|>' + message.content + '<|end|>' -}}"
    "{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}")
LLAMA3 = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content']"
    " + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")


def rendered_tail(template: str, **kwargs) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    messages = [{"role": "user", "content": "2+2?"}]
    prompt = env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                              bos_token="<s>", **kwargs)
    return prompt[-40:]


@pytest.mark.parametrize("template, kwargs, fmt, starts_in", [
    (R1_DISTILL, {}, THINK, True),
    (QWEN3, {}, THINK, False),
    (QWEN3, {"enable_thinking": False}, THINK, False),
    (SMOLLM3, {}, THINK, False),
    (SMOLLM3, {"enable_thinking": False}, THINK, False),
    (GPT_OSS, {}, HARMONY, False),
    (LLAMA3, {}, NONE, False),
])
def test_detect_from_template(template, kwargs, fmt, starts_in):
    assert detect_format(template, [], rendered_tail(template, **kwargs)) == (fmt, starts_in)


def test_detect_from_vocabulary():
    assert detect_format(LLAMA3, ["<|im_start|>", "<think>", "</think>"]) == (THINK, False)
    assert detect_format(None, ["<|start|>", "<|channel|>", "<|message|>", "<|end|>"]) == (HARMONY, False)
    assert detect_format(None, ["<|channel|>"]) == (NONE, False)
    assert detect_format(None, []) == (NONE, False)


def test_detect_open_block_in_prompt_tail():
    assert detect_format(None, ["<think>"], "<|im_start|>assistant\n<think>\n") == (THINK, True)
    assert detect_format(None, ["<think>"], "<think>\n\n</think>\n\n") == (THINK, False)
    assert detect_format(GPT_OSS, [], "<|start|>assistant<|channel|>analysis<|message|>") == (HARMONY, True)
    assert detect_format(LLAMA3, [], "assistant<think>\n") == (NONE, False)  # no format, no block
