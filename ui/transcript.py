"""A chat rendered as Markdown in a read-only QTextBrowser (code blocks in a monospace font)."""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QTimer
from PySide6.QtGui import QFontDatabase, QTextCharFormat, QTextCursor, QTextFormat
from PySide6.QtWidgets import QTextBrowser, QWidget

ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "System"}
RENDER_INTERVAL_MS = 40  # at most ~25 re-layouts a second while tokens stream in


@dataclass
class TranscriptMessage:
    role: str
    content: str
    status: str = "done"  # done | streaming | stopped | error
    error: str | None = None


def to_markdown(messages: list[TranscriptMessage]) -> str:
    """The transcript as one Markdown document: a heading per turn, the text as the model wrote it."""
    parts: list[str] = []
    for m in messages:
        if m.role == "system":
            continue
        title = ROLE_TITLES.get(m.role, m.role.title())
        body = m.content
        if m.status == "streaming":
            body = (body + " ▍") if body else "_…thinking_"
        if _open_fence(body):  # an unfinished code block must not swallow what follows
            body += "\n```"
        parts.append(f"#### {title}\n\n{body}")
        if m.status == "stopped":
            parts.append("_(stopped)_")
        elif m.status == "error":
            parts.append(f"> **⚠ Error:** {m.error or 'the reply failed'}")
    return "\n\n".join(parts) + "\n"


def _open_fence(text: str) -> bool:
    return sum(1 for line in text.splitlines() if line.lstrip().startswith("```")) % 2 == 1


class TranscriptView(QTextBrowser):
    """Re-renders on a short timer rather than per token; keeps following the end if it was there."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("transcript")
        self.setOpenExternalLinks(True)
        self.setReadOnly(True)
        self._messages: list[TranscriptMessage] = []
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self.render_now)

    @property
    def messages(self) -> list[TranscriptMessage]:
        return self._messages

    def set_messages(self, messages: list[TranscriptMessage]) -> None:
        self._messages = list(messages)
        self.render_now()

    def schedule_render(self) -> None:
        if not self._render_timer.isActive():
            self._render_timer.start()

    def render_now(self) -> None:
        self._render_timer.stop()
        bar = self.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 4
        self.setMarkdown(to_markdown(self._messages))
        self._style_code_blocks()
        if at_end:
            bar.setValue(bar.maximum())

    def _style_code_blocks(self) -> None:
        """Monospace font and a tinted background for fenced and indented code blocks."""
        mono = QFontDatabase.systemFont(QFontDatabase.FixedFont)
        shade = self.palette().alternateBase().color()
        block = self.document().begin()
        while block.isValid():
            fmt = block.blockFormat()
            if fmt.hasProperty(QTextFormat.BlockCodeFence) or fmt.hasProperty(QTextFormat.BlockCodeLanguage) \
                    or fmt.nonBreakableLines():
                cursor = QTextCursor(block)
                fmt.setBackground(shade)
                cursor.setBlockFormat(fmt)
                cursor.movePosition(QTextCursor.StartOfBlock)
                cursor.movePosition(QTextCursor.EndOfBlock, QTextCursor.KeepAnchor)
                char = QTextCharFormat()
                char.setFont(mono)
                char.setFontFixedPitch(True)
                cursor.mergeCharFormat(char)
            block = block.next()

    def plain_text(self) -> str:
        return self.toPlainText()

    def sizeHint(self):  # noqa: N802 - Qt name
        hint = super().sizeHint()
        hint.setWidth(max(hint.width(), 480))
        return hint

