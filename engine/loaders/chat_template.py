"""The model's chat template (`tokenizer.chat_template` in the GGUF), rendered like HF does.

Same variables and helpers as transformers' `apply_chat_template`: messages, add_generation_prompt,
bos_token, eos_token, tools/documents and other extras; raise_exception, strftime_now, tojson;
trim_blocks + lstrip_blocks + loopcontrols. Rendering runs in SafeTemplateEnvironment (the
template is untrusted input). A file without a template gets ChatML when its vocabulary has
<|im_start|> (llama.cpp's own default) and a plain "Role: content" layout otherwise, whose
replies stop at the next turn's label (`turn_stops`). A template that reads a message's content
only as typed parts (SmolVLM's and Idefics' `{% for line in message['content'] %}{{ line['text'] }}`)
gets each message's text as one text part, as llama.cpp's minja does (`typed_content`).
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2

from engine.loaders.template_sandbox import SafeTemplateEnvironment

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
PLAIN_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] | capitalize }}: {{ message['content'] }}\n\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


class TemplateError(ValueError):
    """A chat template that does not parse, or fails or is refused while rendering."""


def raise_exception(message: str):
    raise TemplateError(f"the chat template refused the conversation: {message}")


def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
           separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """HF's tojson: no HTML escaping (jinja2's own escapes <, >, & for HTML)."""
    if indent is not None and not 0 <= int(indent) <= 16:
        raise TemplateError("tojson indent must be between 0 and 16")
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template; `render(messages)` returns the prompt text."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "",
                 fallback: str = CHATML_TEMPLATE) -> None:
        self.is_fallback = not source
        self.source: str = source or fallback
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._env = SafeTemplateEnvironment()
        self._env.filters["tojson"] = tojson
        self._env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
        try:
            self._template = self._env.compile_template(self.source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"the chat template does not parse (line {e.lineno}): {e.message}"
                                ) from None
        except Exception as e:  # anything jinja2 raises while compiling
            raise TemplateError(f"the chat template cannot be compiled: {e}") from None

    @property
    def plain_layout(self) -> bool:
        """No template and no ChatML tokens: a base model, for text completion; chats with it are
        laid out as plain `Role: text` lines, which it tends to continue rather than answer."""
        return self.is_fallback and self.source == PLAIN_TEMPLATE

    @property
    def turn_stops(self) -> list[str]:
        """Stop strings a reply needs beyond the model's own end-of-turn token: in the plain
        layout, the next turn's label (a base model such as Gemma 3 270M writes the conversation
        on, both sides of it); none for a real template or ChatML."""
        if self.plain_layout:
            return ["\nUser:", "\nAssistant:", "\nSystem:"]
        return []

    @classmethod
    def from_gguf(cls, path: str | Path) -> "ChatTemplate":
        """Template and BOS/EOS strings from the file's metadata (never from its name)."""
        meta = read_template_metadata(path)
        fallback = CHATML_TEMPLATE if meta["has_chatml_tokens"] else PLAIN_TEMPLATE
        return cls(meta["chat_template"], meta["bos_token"], meta["eos_token"], fallback=fallback)

    @classmethod
    def from_model(cls, path: str | Path, template_file: str | Path | None = None) -> "ChatTemplate":
        """A GGUF file's template, or a Hugging Face directory's (read_hf_template_metadata); with
        `template_file`, that file's template in its place (BOS/EOS still the model's)."""
        if template_file is None and not Path(path).is_dir():
            return cls.from_gguf(path)
        meta = read_hf_template_metadata(path) if Path(path).is_dir() else read_template_metadata(path)
        fallback = CHATML_TEMPLATE if meta["has_chatml_tokens"] else PLAIN_TEMPLATE
        source = meta["chat_template"]
        if template_file is not None:
            try:
                source = Path(template_file).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise TemplateError(f"cannot read the chat template file {template_file}: {e}") from None
            if not source.strip():
                raise TemplateError(f"the chat template file {template_file} is empty")
        return cls(source, meta["bos_token"], meta["eos_token"], fallback=fallback)

    @cached_property
    def typed_content(self) -> bool:
        """Whether the template shows a message's content only when it is a list of typed parts:
        a string renders as nothing there (the words and any image marker silently gone)."""
        probe = "ember-content-probe"

        def shows(content) -> bool:
            try:
                return probe in self._generate({"bos_token": self.bos_token, "eos_token": self.eos_token,
                                                "messages": [{"role": "user", "content": content}],
                                                "add_generation_prompt": True}, len(probe))
            except TemplateError:
                return False

        return not shows(probe) and shows([{"type": "text", "text": probe}])

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               **extra: Any) -> str:
        """The prompt for `messages` ({"role", "content"} dicts; OpenAI text parts are joined).

        `extra` become template variables (tools, documents, ...), as in HF."""
        msgs = _normalize(messages)
        size = sum(len(str(m.get("content", ""))) for m in msgs) + len(json.dumps(extra,
                                                                                  default=str))
        if self.typed_content:
            msgs = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in msgs]
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token, **extra,
                     "messages": msgs, "add_generation_prompt": add_generation_prompt}
        return self._generate(variables, size)

    def _generate(self, variables: dict, size: int) -> str:
        env = self._env
        env.start(size)
        parts: list[str] = []
        total = 0
        try:
            for chunk in self._template.generate(**variables):
                total += len(chunk)
                env.check_size(total, "an output")
                parts.append(chunk)
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as e:
            raise TemplateError(f"the chat template was stopped: {e}") from None
        except RecursionError:
            raise TemplateError("the chat template recursed too deeply") from None
        except Exception as e:
            raise TemplateError(f"the chat template failed: {type(e).__name__}: {e}") from None
        return "".join(parts)

    def __repr__(self) -> str:
        kind = "fallback" if self.is_fallback else "model"
        return f"ChatTemplate({kind}, {len(self.source)} chars)"


def _normalize(messages: list[dict]) -> list[dict]:
    """Copies with string content: None → "", OpenAI content parts → their texts joined."""
    if not isinstance(messages, (list, tuple)):
        raise TemplateError("messages must be a list of {'role', 'content'} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise TemplateError(f"message {i} needs a string 'role'")
        m = dict(m)
        content = m.get("content")
        if content is None:
            m["content"] = ""
        elif isinstance(content, list):
            texts = [p.get("text", "") for p in content if isinstance(p, dict)
                     and p.get("type", "text") == "text"]
            if len(texts) != len(content):
                raise TemplateError(f"message {i} has content parts other than text")
            m["content"] = "\n".join(str(t) for t in texts)
        elif not isinstance(content, str):
            raise TemplateError(f"message {i} content must be a string or a list of text parts")
        out.append(m)
    return out


def read_template_metadata(path: str | Path) -> dict:
    """`tokenizer.chat_template`, BOS/EOS token text and whether <|im_start|> is a token."""
    from engine.model_files.gguf_file import GGUFFile

    try:
        f = GGUFFile(path)
    except OSError as e:
        raise FileNotFoundError(f"cannot open {path}: {e}") from None
    except ValueError as e:
        raise TemplateError(f"cannot read GGUF metadata from {path}: {e}") from None
    template = f.get("tokenizer.chat_template")
    tokens = f.get("tokenizer.ggml.tokens") or []

    def token(key: str) -> str:
        i = f.get(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else ""

    return {
        "chat_template": template if isinstance(template, str) and template.strip() else None,
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "has_chatml_tokens": "<|im_start|>" in tokens,
    }


def read_hf_template_metadata(path: str | Path) -> dict:
    """The directory's chat template (chat_template.jinja, else tokenizer_config.json's
    chat_template: a string or a list of named ones, "default" first), BOS/EOS text from
    tokenizer_config.json, and whether tokenizer.json has <|im_start|>."""
    from engine.loaders.hf_tokenizer import read_json, token_text

    path = Path(path)
    try:
        cfg = read_json(path / "tokenizer_config.json")
    except ValueError as e:
        raise TemplateError(str(e)) from None
    jinja = path / "chat_template.jinja"
    template = jinja.read_text(encoding="utf-8") if jinja.is_file() else cfg.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default", next(iter(named.values()), None))
    tok = path / "tokenizer.json"
    has_chatml = tok.is_file() and '"<|im_start|>"' in tok.read_text(encoding="utf-8", errors="replace")
    return {
        "chat_template": template if isinstance(template, str) and template.strip() else None,
        "bos_token": token_text(cfg.get("bos_token")) or "",
        "eos_token": token_text(cfg.get("eos_token")) or "",
        "has_chatml_tokens": has_chatml,
    }
