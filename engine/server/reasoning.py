"""Reasoning vs answer: split a reasoning model's reply into `reasoning_content` and `content`,
as llama.cpp's server does with `--reasoning-format deepseek`, one text delta at a time.

Two formats are in the wild:
- THINK_TAGS (DeepSeek-R1 and its distills, Qwen3, QwQ, SmolLM3): `<think>reasoning</think>answer`.
  Some templates open the block in the prompt (`<｜Assistant｜><think>\\n`): the reply then starts
  inside it and only `</think>` appears.
- HARMONY (gpt-oss): messages `<|channel|>NAME<|message|>body<|end|>`, later ones after
  `<|start|>assistant`. Channel analysis is reasoning; final and commentary (the preamble a model
  writes before a tool call) are content; a message addressed to a recipient (`to=functions.f`)
  is a tool call, not text, and goes to neither (the tool-call parser reads the raw reply).

Whitespace, as llama.cpp's common/chat-parser.cpp: reasoning is stripped at both ends (the
newline after `<think>` and before `</think>`), whitespace after `</think>` is dropped before the
answer; whitespace before a leading `<think>` stays content. A THINK_TAGS reply that does not
start with `<think>` (the model skipped thinking) is all content, tags and all.

The streaming parser holds back only what could still turn out to be markup or stripped
whitespace: the start of a tag split across deltas (`</thi`) and the whitespace just before it.
"""
from __future__ import annotations

import enum
import re
from typing import Iterable

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CHANNEL, MESSAGE = "<|channel|>", "<|message|>"
MESSAGE_ENDS = ("<|end|>", "<|return|>", "<|call|>")
WHITESPACE = " \t\n\r\f\v"  # C's isspace, which llama.cpp strips with; not Unicode's spaces


class ReasoningFormat(enum.Enum):
    NONE = "none"
    THINK_TAGS = "think_tags"
    HARMONY = "harmony"


def detect_format(chat_template: str | None, special_tokens: Iterable[str],
                  prompt_tail: str = "") -> tuple[ReasoningFormat, bool]:
    """(format, starts_in_reasoning) from the template text and the vocabulary's special/added
    tokens, as llama.cpp's common/chat.cpp picks a handler. `prompt_tail` is the end of the
    prompt as rendered with add_generation_prompt: a tail that leaves a block open (DeepSeek-R1
    distills end in `<think>\\n`) means the reply starts inside the reasoning."""
    template = chat_template or ""
    tokens = set(special_tokens)
    if (CHANNEL in template and MESSAGE in template) or {CHANNEL, MESSAGE} <= tokens:
        tail = prompt_tail.rstrip(WHITESPACE)
        return ReasoningFormat.HARMONY, tail.endswith(CHANNEL + "analysis" + MESSAGE)
    if THINK_OPEN in template or THINK_CLOSE in template or tokens & {THINK_OPEN, THINK_CLOSE}:
        # Qwen3 with enable_thinking=false renders an empty closed block: not open.
        is_open = prompt_tail.rfind(THINK_OPEN) > prompt_tail.rfind(THINK_CLOSE)
        return ReasoningFormat.THINK_TAGS, is_open
    return ReasoningFormat.NONE, False


def _held(text: str, tags: Iterable[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of one of `tags`: the part a
    later delta may complete into a tag, so it is not emitted yet."""
    longest = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), longest, -1):
            if text.endswith(tag[:n]):
                longest = n
                break
    return longest


# Where the next character goes. _HEAD: not known yet (the reply's start, what follows
# `</think>`, a harmony header); _REASONING / _ANSWER / _SKIP: the body of a block or message,
# up to its end tag; _CONTENT: the rest of the reply is the answer, no markup left to find.
_HEAD, _REASONING, _ANSWER, _SKIP, _CONTENT = "head", "reasoning", "answer", "skip", "content"
_RECIPIENT = re.compile(r"(?:^|[\s>])to=")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"(\w+)")


class ReasoningParser:
    """Feed a reply's text deltas, get (reasoning_delta, content_delta) back for each; then
    finish() for what was held back. `_buf` is text received and not yet given out."""

    def __init__(self, fmt: ReasoningFormat, starts_in_reasoning: bool = False):
        self.fmt = fmt
        self._buf = ""
        self._at_reply_start = True  # before a leading `<think>`, whitespace is content
        self._opened_by_prompt = starts_in_reasoning and fmt is ReasoningFormat.THINK_TAGS
        self._lstrip = False  # at the start of a reasoning body: whitespace is dropped
        self._ends = (THINK_CLOSE,) if fmt is ReasoningFormat.THINK_TAGS else MESSAGE_ENDS
        if fmt is ReasoningFormat.NONE:
            self._state = _CONTENT
        elif fmt is ReasoningFormat.HARMONY and starts_in_reasoning:
            self._state, self._lstrip, self._at_reply_start = _REASONING, True, False
        else:
            self._state = _HEAD

    @property
    def reasoning_open(self) -> bool:
        """Inside reasoning that has not been closed; at the end of a reply this means the
        budget (max_tokens) ran out while the model was still thinking."""
        if self._state == _HEAD:
            return self._at_reply_start and self._opened_by_prompt
        return self._state == _REASONING

    def feed(self, delta: str) -> tuple[str, str]:
        self._buf += delta
        return self._drain(final=False)

    def finish(self) -> tuple[str, str]:
        """Give out what was held back: the reply has ended, nothing can complete a tag now."""
        return self._drain(final=True)

    def _drain(self, final: bool) -> tuple[str, str]:
        out = {_REASONING: [], _ANSWER: []}
        while self._step(out, final):
            pass
        return "".join(out[_REASONING]), "".join(out[_ANSWER])

    def _step(self, out: dict[str, list[str]], final: bool) -> bool:
        """Give out what can be decided of `_buf`; True when the state changed (step again)."""
        if self._state == _CONTENT:
            out[_ANSWER].append(self._buf)
            self._buf = ""
            return False
        if self._state == _HEAD:
            if self.fmt is ReasoningFormat.THINK_TAGS:
                return self._think_head(out, final)
            return self._harmony_head(out, final)
        return self._body(out, final)

    def _body(self, out: dict[str, list[str]], final: bool) -> bool:
        """Up to the body's end tag; reasoning is stripped at both ends."""
        state = self._state
        if self._lstrip:
            self._buf = self._buf.lstrip(WHITESPACE)
            self._lstrip = not self._buf
        buf = self._buf
        found = [(i, end) for end in self._ends if (i := buf.find(end)) >= 0]
        if found:
            i, end = min(found)
            text, self._buf = buf[:i], buf[i + len(end):]
            self._state, self._lstrip = _HEAD, False
        elif final:
            text, self._buf = buf, ""
        else:
            text = buf[:len(buf) - _held(buf, self._ends)]
            if state == _REASONING:  # whitespace before a closing tag is stripped: hold it too
                text = text.rstrip(WHITESPACE)
            self._buf = buf[len(text):]
        if state == _REASONING:
            out[_REASONING].append(text.rstrip(WHITESPACE) if found or final else text)
        elif state == _ANSWER:
            out[_ANSWER].append(text)
        return bool(found)

    def _think_head(self, out: dict[str, list[str]], final: bool) -> bool:
        """At the reply's start or after `</think>`: a block opens, or the answer begins."""
        buf = self._buf
        rest = buf.lstrip(WHITESPACE)
        if rest.startswith(THINK_OPEN):
            if self._at_reply_start:
                out[_ANSWER].append(buf[:len(buf) - len(rest)])
            self._buf = rest[len(THINK_OPEN):]
        elif THINK_OPEN.startswith(rest) and not final:
            return False  # "", "<", "<thi": wait for more
        elif self._at_reply_start and self._opened_by_prompt:
            self._buf = rest
        else:
            self._buf = buf if self._at_reply_start else rest  # whitespace after </think> goes
            self._state, self._at_reply_start = _CONTENT, False
            return True
        self._state, self._lstrip, self._at_reply_start = _REASONING, True, False
        return True

    def _harmony_head(self, out: dict[str, list[str]], final: bool) -> bool:
        """Wait for a whole header (up to `<|message|>`), then route the body by channel and
        recipient. A reply that does not open with markup is plain content; an unfinished header
        at the end is dropped, as llama.cpp drops what follows the last message."""
        buf = self._buf
        if self._at_reply_start and not (buf.startswith("<|") or "<|".startswith(buf)):
            self._state = _CONTENT
            return True
        i = buf.find(MESSAGE)
        if i < 0:
            if final:
                if self._at_reply_start and not buf.startswith("<|"):
                    out[_ANSWER].append(buf)
                self._buf = ""
            return False
        header, self._buf = buf[:i], buf[i + len(MESSAGE):]
        name = _CHANNEL_NAME.search(header)
        channel = name.group(1) if name else ""
        if _RECIPIENT.search(header):
            self._state = _SKIP  # a tool call: not text for either field
        elif channel == "analysis":
            self._state, self._lstrip = _REASONING, True
        elif channel in ("final", "commentary"):
            self._state = _ANSWER
        else:
            self._state = _SKIP
        self._at_reply_start = False
        return True


def split(text: str, fmt: ReasoningFormat, starts_in_reasoning: bool = False) -> tuple[str, str]:
    """(reasoning, content) of a whole reply, defined as feed + finish so that it cannot
    disagree with streaming."""
    parser = ReasoningParser(fmt, starts_in_reasoning)
    reasoning, content = parser.feed(text)
    more_reasoning, more_content = parser.finish()
    return reasoning + more_reasoning, content + more_content


def reasoning_format(template, prompt: str) -> tuple[ReasoningFormat, bool]:
    """The thinking format of a model's own chat template (a ChatTemplate; a fallback layout has
    none) and whether the rendered prompt leaves the block open. Harmony's channel markup is
    control tokens: its requests ask the detokenizer to write them (SamplingParams.render_special)."""
    if template.is_fallback:
        return ReasoningFormat.NONE, False
    return detect_format(template.source, (), prompt[-256:])


def thinking_switches(template) -> dict:
    """What a model's template lets a client ask of its thinking, for the engine's status: its
    format, whether `enable_thinking` turns it off (Qwen3, SmolLM3), and whether it takes a
    `reasoning_effort` (gpt-oss: low, medium, high)."""
    fmt, _ = reasoning_format(template, "")
    source = "" if template.is_fallback else template.source
    return {"format": fmt.value, "switch": fmt is ReasoningFormat.THINK_TAGS and "enable_thinking" in source,
            "effort": fmt is not ReasoningFormat.NONE and "reasoning_effort" in source}
