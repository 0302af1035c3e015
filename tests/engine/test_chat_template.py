"""ChatTemplate: the bundled template as llama.cpp renders it, HF extras, fallbacks, and a sandbox
that refuses Python internals and runaway work."""
from __future__ import annotations

import ctypes
import time

import pytest

from engine.loaders.chat_template import CHATML_TEMPLATE, ChatTemplate, TemplateError

CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi there! Ünïcödé 🤖"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Write\n  code:\tx = 1"},
]

# Shaped after popular published templates (Llama 3, Qwen 2.5 with tools, Mistral's alternation
# check): namespace, loop.last, tojson, strip, raise_exception, trim/lstrip of block lines.
LLAMA3_LIKE = """{{- bos_token }}
{%- set ns = namespace(system='') %}
{%- for m in messages %}
    {%- if m['role'] == 'system' %}{% set ns.system = m['content'] | trim %}{% endif %}
{%- endfor %}
{%- if ns.system %}<|start_header_id|>system<|end_header_id|>\n\n{{ ns.system }}<|eot_id|>{% endif %}
{%- for m in messages if m['role'] != 'system' %}
<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>
{%- if loop.last and add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}
{%- endfor %}"""
QWEN_TOOLS_LIKE = """{%- if tools %}
<|im_start|>system
# Tools
<tools>
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
</tools><|im_end|>
{% endif %}
{% for message in messages %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
{% endfor %}
{% if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{% endif %}"""
MISTRAL_LIKE = """{{ bos_token }}{% for message in messages %}
{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
{% endif %}
{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}
{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}
{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}
{% endfor %}"""


def llama_cpp_chatml(messages, add_ass=True) -> str:
    """llama.cpp's own (non-jinja) renderer, fed the template so that it detects ChatML."""
    import llama_cpp

    arr = (llama_cpp.llama_chat_message * len(messages))(*[
        llama_cpp.llama_chat_message(m["role"].encode(), m["content"].encode()) for m in messages])
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(CHATML_TEMPLATE.encode(), arr, len(messages), add_ass,
                                            buf, len(buf))
    assert 0 < n < len(buf)
    return buf.raw[:n].decode()


def hf_style(template: str, messages, bos="<s>", eos="</s>", **kw) -> str:
    """llama-cpp-python's Jinja2ChatFormatter: an independent HF-compatible renderer."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    return Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)(messages=messages, **kw).prompt


@pytest.fixture(scope="module")
def bundled(bundled_model_path) -> ChatTemplate:
    return ChatTemplate.from_gguf(bundled_model_path)


@pytest.mark.slow
def test_bundled_template_renders_chatml_like_llama_cpp(bundled):
    assert not bundled.is_fallback and "<|im_start|>" in bundled.source
    assert bundled.bos_token == "<|im_start|>" and bundled.eos_token == "<|im_end|>"
    assert bundled.render(CHAT) == llama_cpp_chatml(CHAT)
    assert bundled.render(CHAT[:2], add_generation_prompt=False) == llama_cpp_chatml(CHAT[:2], False)


@pytest.mark.slow
def test_bundled_template_adds_smollm_system_prompt_like_hf(bundled):
    msgs = CHAT[1:]
    out = bundled.render(msgs)
    assert out == hf_style(bundled.source, msgs, bundled.bos_token, bundled.eos_token)
    assert out.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert out.endswith("<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("template", [LLAMA3_LIKE, QWEN_TOOLS_LIKE, CHATML_TEMPLATE])
def test_published_template_shapes_match_an_hf_style_renderer(template):
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"tz": "<UTC>"}}}]
    ours = ChatTemplate(template, "<s>", "</s>").render(CHAT, tools=tools)
    assert ours == hf_style(template, CHAT, tools=tools)
    assert ours.strip()


JINJA_FEATURES = [  # the guards must not change what ordinary templates do
    "{% for m in messages %}{{ loop.index }}/{{ loop.length }}/{{ loop.revindex }}"
    "{{ loop.cycle('x', 'y') }}{{ loop.previtem.content if loop.previtem }}"
    "{{ loop.nextitem.role if loop.nextitem }}{% endfor %}",
    "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"
    "{% for m in messages|reverse %}{{ m.content }}{% endfor %}{% for x in [] %}x{% else %}none{% endfor %}",
    "{% set ns = namespace(found=false) %}{% for m in messages %}{% if m.role == 'assistant' %}"
    "{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}"
    "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }}",
    "{% macro tag(m) %}[{{ m.role|upper }}]{% endmacro %}{% for m in messages %}{{ tag(m) }}{% endfor %}"
    "{{ '%s|%05.1f' % ('q', 3.14159) }}{{ 'Hello'[1:3] }}{{ ' x '.strip() }}{{ 'a b'.split() }}",
    "{% for m in messages recursive %}{{ m.role }}{% if m.sub %}({{ loop(m.sub) }}){% endif %}{% endfor %}",
]


@pytest.mark.parametrize("template", JINJA_FEATURES)
def test_loops_macros_and_filters_render_as_in_plain_jinja(template):
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c", "sub": [{"role": "tool", "content": "d"}]}]
    assert ChatTemplate(template).render(msgs) == hf_style(template, msgs)


def test_raise_exception_becomes_template_error_with_its_message():
    t = ChatTemplate(MISTRAL_LIKE, "<s>", "</s>")
    ok = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert t.render(ok) == hf_style(MISTRAL_LIKE, ok)
    with pytest.raises(TemplateError, match="roles must alternate"):
        t.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_hf_extras():
    t = ChatTemplate(
        "{{ messages | tojson }}|{{ strftime_now('%Y') }}|"
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}|"
        "{% generation %}{{ eos_token }}{% endgeneration %}|{{ extra }}")
    out = t.render([{"role": "user", "content": "<b>&"}], extra="x")
    assert out == f'[{{"role": "user", "content": "<b>&"}}]|{time.strftime("%Y")}|user||x'


def test_trim_and_lstrip_blocks_like_hf():
    t = ChatTemplate("{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}")
    assert t.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a\nb\n"


def test_content_parts_and_none_are_normalized():
    t = ChatTemplate(CHATML_TEMPLATE)
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
             {"role": "assistant", "content": None}]
    assert t.render(parts, add_generation_prompt=False) == (
        "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n")
    for bad in ([{"content": "x"}], "not a list", [{"role": "user", "content": 3}],
                [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]):
        with pytest.raises(TemplateError):
            t.render(bad)


@pytest.mark.parametrize("source", ["{% for x in %}", "{{ unclosed", "{% if %}{% endif %}",
                                    "{% endfor %}", "{{ x | no_such_filter }}"])
def test_malformed_template_is_a_template_error(source):
    with pytest.raises(TemplateError, match="parse|compiled"):
        ChatTemplate(source)


@pytest.mark.parametrize("source", ["{{ no_such_function() }}", "{{ messages[0].content.nope() }}",
                                    "{{ 1 // 0 }}", "{{ messages['x'] + 1 }}"])
def test_failing_template_is_a_template_error(source):
    with pytest.raises(TemplateError, match="failed"):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])


ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.system('echo pwned') }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ ''.__class__ }}",
    "{{ messages.__class__.__base__ }}",
    "{{ raise_exception.__globals__ }}",
    "{{ (messages|first).__class__ }}",
    "{{ self._TemplateReference__context }}",
    "{{ messages.append({'role': 'x'}) }}",
    "{{ messages['__class__'] }}",
    "{% set f = strftime_now.__code__ %}{{ f }}",
]


@pytest.mark.parametrize("source", ESCAPES)
def test_sandbox_escapes_are_refused(source):
    with pytest.raises(TemplateError, match="not allowed|stopped"):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])


RUNAWAYS = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}",
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "{{ 'a' * 1000000000 }}",
    "{{ [1] * 1000000000 }}",
    "{{ 7 ** 100000000 }}",
    "{% set n = 99999999 %}{{ 3 ** n }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{{ 'a' | center(1000000000) }}",
    "{{ 'a'.ljust(1000000000) }}",
    "{{ '%1000000000d' % 1 }}",
    "{{ '{:>1000000000}'.format(1) }}",
    "{{ 'ab' | replace('a', 'a' * 100000) | replace('a', 'a' * 100000) }}",
    "{{ range(100000) | join('x' * 1000) }}",
    "{{ lipsum(1000000000) }}",
]


@pytest.mark.parametrize("source", RUNAWAYS)
def test_runaway_templates_stop_quickly_with_a_clear_error(source):
    t0 = time.monotonic()
    with pytest.raises(TemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])
    assert time.monotonic() - t0 < 10.0


def test_large_legitimate_conversation_still_renders():
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 2000}
            for i in range(200)]  # 2 MB of text: limits scale with the input
    out = ChatTemplate(CHATML_TEMPLATE).render(msgs)
    assert len(out) > 2_000_000


def write_gguf(path, tokens, template=None):
    import gguf

    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    if template is not None:
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_file_without_template_falls_back_to_chatml_or_plain(tmp_path):
    chatml = ChatTemplate.from_gguf(write_gguf(tmp_path / "a.gguf", ["<s>", "</s>", "<|im_start|>", "a"]))
    assert chatml.is_fallback and chatml.render(CHAT) == llama_cpp_chatml(CHAT)
    plain = ChatTemplate.from_gguf(write_gguf(tmp_path / "b.gguf", ["<s>", "</s>", "a"]))
    assert plain.is_fallback and plain.bos_token == "<s>" and plain.eos_token == "</s>"
    assert plain.render(CHAT[:2]) == "System: You are terse.\n\nUser: Hi there! Ünïcödé 🤖\n\nAssistant:"
    # a reply in the plain layout ends at the next turn's label; ChatML and real templates end on tokens
    assert plain.turn_stops == ["\nUser:", "\nAssistant:", "\nSystem:"] and chatml.turn_stops == []


def test_template_from_file_metadata(tmp_path):
    t = ChatTemplate.from_gguf(write_gguf(tmp_path / "c.gguf", ["<s>", "</s>"], "{{ bos_token }}{{ messages[0].content }}"))
    assert not t.is_fallback and t.render([{"role": "user", "content": "x"}]) == "<s>x" and t.turn_stops == []


def test_unreadable_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + b"\0" * 64)
    with pytest.raises(TemplateError, match="GGUF"):
        ChatTemplate.from_gguf(bad)
    with pytest.raises(FileNotFoundError):
        ChatTemplate.from_gguf(tmp_path / "missing.gguf")


def test_a_base_model_is_known_for_text_completion_before_it_loads(tmp_path):
    from app.model_kind import is_completion_model
    from engine.model_files.chat_layout import completion_only

    base = write_gguf(tmp_path / "base.gguf", ["<s>", "</s>", "a"])
    chatml = write_gguf(tmp_path / "chatml.gguf", ["<s>", "</s>", "<|im_start|>", "a"])
    templated = write_gguf(tmp_path / "t.gguf", ["<s>", "</s>"], "{{ messages[0].content }}")
    assert [completion_only(p) for p in (base, chatml, templated)] == [True, False, False]
    assert ChatTemplate.from_gguf(base).plain_layout and not ChatTemplate.from_gguf(chatml).plain_layout
    assert is_completion_model(base) and not is_completion_model(base, custom_template=True)
    assert not is_completion_model(tmp_path / "missing.gguf")
