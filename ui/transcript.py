"""A chat rendered as Markdown in a read-only QTextBrowser: code blocks monospace and coloured
(pygments), a line of actions under each message (copy, copy code, edit & resend, earlier replies),
tool calls in a reply (the model's own syntax, engine/model_files/tool_call_syntax.py) as a
collapsed line per call — name and arguments in brief — that opens to the arguments as JSON, and
a reasoning model's thinking above its answer: "Thinking…" while it streams, then one collapsed
line, "Thought for N s", that opens to the thoughts.

The actions are links of the form `ember:<action>/<message index>[/<code block>]`; the view emits
`action_requested(action, index, block)` and the chat view does the work.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from PySide6.QtCore import QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QFontDatabase, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QTextBrowser, QWidget

from engine.model_files.tool_call_syntax import ToolFormat, parse_tool_calls
from ui.code_highlight import code_blocks, highlight

ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "System"}
RENDER_INTERVAL_MS = 40  # at most ~25 re-layouts a second while tokens stream in
ACTION_SCHEME = "ember"
_FENCE = re.compile(r"^\s*```")


@dataclass
class TranscriptMessage:
    role: str
    content: str
    status: str = "done"  # done | streaming | stopped | error
    error: str | None = None
    msg_id: int | None = None  # its row in the chat store
    versions: list[str] = field(default_factory=list)  # every reply a Regenerate wrote here (this session)
    shown: int = 0  # which of `versions` `content` is
    opened: set[int] = field(default_factory=set)  # the tool calls shown with their arguments
    reasoning: str = ""  # a reasoning model's thinking (reasoning_content)
    thought_s: float | None = None  # how long it thought: set when the answer begins
    show_thinking: bool = False  # the thoughts opened by a click

    def add_version(self) -> None:
        """The reply just written becomes the newest version (after the earlier ones it replaced)."""
        if self.content and (not self.versions or self.versions[-1] != self.content):
            self.versions.append(self.content)
        self.shown = max(0, len(self.versions) - 1)

    def flip(self, step: int) -> bool:
        """Show the previous (-1) or next (+1) version; False at either end."""
        j = self.shown + step
        if len(self.versions) < 2 or not 0 <= j < len(self.versions):
            return False
        self.shown, self.content = j, self.versions[j]
        return True


def _link(action: str, index: int, text: str, block: int | None = None) -> str:
    target = f"{ACTION_SCHEME}:{action}/{index}" + (f"/{block}" if block is not None else "")
    return f"[{text}]({target})"


def _with_code_links(body: str, index: int) -> str:
    """A "Copy code" link after each closed fenced block."""
    out, inside, n = [], False, 0
    for line in body.split("\n"):
        out.append(line)
        if _FENCE.match(line):
            inside = not inside
            if not inside:
                out += ["", _link("code", index, "Copy code", n), ""]
                n += 1
    return "\n".join(out)


def _actions(m: TranscriptMessage, i: int) -> str:
    links = [_link("copy", i, "Copy")]
    if m.role == "user":
        links.append(_link("edit", i, "Edit & resend"))
    if len(m.versions) > 1:
        links.append(f"{_link('prev', i, '‹')} reply {m.shown + 1} of {len(m.versions)} {_link('next', i, '›')}")
    return " · ".join(links)


def tool_calls(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(the reply without its tool calls, [(name, arguments JSON)]): the syntaxes that mark a
    call explicitly (Hermes/Qwen, Mistral); a Llama 3 call is bare JSON, shown as the model wrote it."""
    for fmt in (ToolFormat.HERMES, ToolFormat.MISTRAL):
        content, calls = parse_tool_calls(fmt, text)
        if calls:
            return content, [(c.name, c.arguments) for c in calls]
    return text, []


def _brief(arguments: str, limit: int = 60) -> str:
    """`city="Paris", unit="celsius"`, cut to `limit` characters."""
    try:
        args = json.loads(arguments)
    except ValueError:
        args = None
    text = (", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
            if isinstance(args, dict) else arguments)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tool_call_lines(m: TranscriptMessage, i: int, calls: list[tuple[str, str]], actions: bool) -> list[str]:
    out = []
    for n, (name, arguments) in enumerate(calls):
        opened = n in m.opened or not actions
        toggle = _link("tool", i, "hide arguments" if opened else "arguments", n) if actions else ""
        out.append(f"{'▾' if opened else '▸'} **Tool call** `{name}({_brief(arguments)})` {toggle}".rstrip())
        if opened:
            try:
                pretty = json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
            except ValueError:
                pretty = arguments
            out.append(f"```json\n{pretty}\n```")
    return out


def _thinking_lines(m: TranscriptMessage, i: int, actions: bool) -> list[str]:
    """While it thinks, the thoughts as they stream; once the answer begins, one line to open them."""
    quoted = "\n".join(f"> {line}" for line in m.reasoning.strip().splitlines()) or "> …"
    if m.status == "streaming" and m.thought_s is None:
        return ["▾ _Thinking…_", quoted]
    took = f"Thought for {m.thought_s:.0f} s" if m.thought_s is not None else "Thoughts"
    opened = m.show_thinking or not actions
    toggle = _link("think", i, "hide" if opened else "show") if actions else ""
    return [f"{'▾' if opened else '▸'} _{took}_ {toggle}".rstrip()] + ([quoted] if opened else [])


def to_markdown(messages: list[TranscriptMessage], actions: bool = False) -> str:
    """The transcript as one Markdown document: a heading per turn, the text as the model wrote it."""
    parts: list[str] = []
    for i, m in enumerate(messages):
        if m.role == "system":
            continue
        title = ROLE_TITLES.get(m.role, m.role.title())
        body, calls = (m.content, []) if m.role != "assistant" or m.status == "streaming" else tool_calls(m.content)
        thinking = _thinking_lines(m, i, actions) if m.reasoning else []
        if m.status == "streaming":
            body = (body + " ▍") if body else ("" if thinking else "_…thinking_")
        if _open_fence(body):  # an unfinished code block must not swallow what follows
            body += "\n```"
        if actions and m.status != "streaming":
            body = _with_code_links(body, i)
        if thinking:
            parts += [f"#### {title}", *thinking]
            if body.strip():
                parts.append(body)
        else:
            parts.append(f"#### {title}\n\n{body}" if body.strip() or not calls else f"#### {title}")
        parts += _tool_call_lines(m, i, calls, actions)
        if m.status == "stopped":
            parts.append("_(stopped)_")
        elif m.status == "error":
            parts.append(f"> **⚠ Error:** {m.error or 'the reply failed'}")
        if actions and m.status != "streaming" and m.content:
            parts.append(_actions(m, i))
    return "\n\n".join(parts) + "\n"


def _open_fence(text: str) -> bool:
    return sum(1 for line in text.splitlines() if line.lstrip().startswith("```")) % 2 == 1


class TranscriptView(QTextBrowser):
    """Re-renders on a short timer rather than per token; keeps following the end while it is there
    (a chat opens at its latest message, however late the layout learns its height)."""

    action_requested = Signal(str, int, int)  # action, message index, code block (-1 when none)

    def __init__(self, parent: QWidget | None = None, actions: bool = True) -> None:
        super().__init__(parent)
        self.setObjectName("transcript")
        self.setOpenLinks(False)
        self.setReadOnly(True)
        self._actions = actions
        self._messages: list[TranscriptMessage] = []
        self._stick_to_end = True
        self._rendering = False
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self.render_now)
        bar = self.verticalScrollBar()
        bar.actionTriggered.connect(self._on_user_scrolled)  # wheel, drag, arrows: not our own setValue
        bar.rangeChanged.connect(self._on_range_changed)
        self.anchorClicked.connect(self._on_anchor_clicked)

    @property
    def messages(self) -> list[TranscriptMessage]:
        return self._messages

    def set_messages(self, messages: list[TranscriptMessage]) -> None:
        self._messages = list(messages)
        self._stick_to_end = True  # a chat opens at its latest message
        self.render_now()

    def schedule_render(self) -> None:
        if not self._render_timer.isActive():
            self._render_timer.start()

    def render_now(self) -> None:
        self._render_timer.stop()
        self._rendering = True
        try:
            self.setMarkdown(to_markdown(self._messages, self._actions))
            self._style_code_blocks()
        finally:
            self._rendering = False
        if self._stick_to_end:
            self.scroll_to_end()

    def scroll_to_end(self) -> None:
        self.moveCursor(QTextCursor.End)  # QTextEdit's first show scrolls to the cursor: keep it at the end
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def showEvent(self, event) -> None:  # noqa: N802 - Qt name
        super().showEvent(event)
        if self._stick_to_end:
            self.scroll_to_end()

    def code_block_texts(self, index: int) -> list[str]:
        """The code blocks of message `index`, as the model wrote them (from its Markdown)."""
        blocks, inside, current = [], False, []
        for line in self._messages[index].content.split("\n"):
            if _FENCE.match(line):
                if inside:
                    blocks.append("\n".join(current))
                inside, current = not inside, []
            elif inside:
                current.append(line)
        return blocks

    def _style_code_blocks(self) -> None:
        """Monospace font and a tinted background for code blocks, then pygments' colours."""
        mono = QFontDatabase.systemFont(QFontDatabase.FixedFont)
        shade = self.palette().alternateBase().color()
        doc = self.document()
        for code in code_blocks(doc):
            for block in code.blocks:
                fmt = block.blockFormat()
                cursor = QTextCursor(block)
                fmt.setBackground(shade)
                cursor.setBlockFormat(fmt)
                cursor.movePosition(QTextCursor.StartOfBlock)
                cursor.movePosition(QTextCursor.EndOfBlock, QTextCursor.KeepAnchor)
                char = QTextCharFormat()
                char.setFont(mono)
                char.setFontFixedPitch(True)
                cursor.mergeCharFormat(char)
        highlight(doc, dark=self.palette().base().color().lightness() < 128)
        self._style_action_lines()

    def _style_action_lines(self) -> None:
        """The action links under each message in a smaller font, so they read as controls, not text."""
        small = QTextCharFormat()
        small.setFontPointSize(max(7.0, self.font().pointSizeF() * 0.85))
        block = self.document().begin()
        while block.isValid():
            first = block.begin()
            if not first.atEnd() and first.fragment().charFormat().anchorHref().startswith(ACTION_SCHEME + ":"):
                cursor = QTextCursor(block)
                cursor.movePosition(QTextCursor.EndOfBlock, QTextCursor.KeepAnchor)
                cursor.mergeCharFormat(small)
            block = block.next()

    def _on_user_scrolled(self, _action: int) -> None:
        bar = self.verticalScrollBar()  # the position is already the new one; the value follows
        self._stick_to_end = bar.sliderPosition() >= bar.maximum() - 4  # follow the end once back at it

    def _on_range_changed(self, _low: int, high: int) -> None:
        if self._stick_to_end and not self._rendering:
            self.verticalScrollBar().setValue(high)

    def _on_anchor_clicked(self, url: QUrl) -> None:
        if url.scheme() != ACTION_SCHEME:
            QDesktopServices.openUrl(url)
            return
        parts = url.path().split("/")
        try:
            action, index = parts[0], int(parts[1])
            block = int(parts[2]) if len(parts) > 2 else -1
        except (IndexError, ValueError):
            return
        if action == "tool" and 0 <= index < len(self._messages):  # open or close a tool call, here
            self._messages[index].opened ^= {block}
            self.render_now()
            return
        if action == "think" and 0 <= index < len(self._messages):  # open or close the thoughts, here
            self._messages[index].show_thinking = not self._messages[index].show_thinking
            self.render_now()
            return
        self.action_requested.emit(action, index, block)

    def plain_text(self) -> str:
        return self.toPlainText()

    def sizeHint(self):  # noqa: N802 - Qt name
        hint = super().sizeHint()
        hint.setWidth(max(hint.width(), 480))
        return hint
