"""A chat rendered as Markdown in a read-only QTextBrowser: code blocks monospace and coloured
(pygments), a line of actions under each message, tool calls collapsed to a line each (a failed one in
red) that opens to its arguments and result, a reasoning model's thinking above its answer
(ui/transcript_markdown.py writes the Markdown).

The actions are links of the form `ember:<action>/<message index>[/<code block>]`; the view opens
and closes tool calls and thoughts itself and emits `action_requested(action, index, block)` for
the rest (ui/message_actions.py does the work).
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, QTimer, QUrl, Signal
from PySide6.QtGui import (QColor, QDesktopServices, QFontDatabase, QTextCharFormat, QTextCursor, QTextDocument,
                           QTextFormat)
from PySide6.QtWidgets import QTextBrowser, QWidget

from ui.code_highlight import code_blocks, highlight
from ui.transcript_markdown import ACTION_SCHEME, FENCE, IMAGE_SCHEME, to_markdown
from ui.transcript_message import TranscriptMessage
from ui.transcript_steps import RESULT_FENCE, STEP_ACTION, WHOLE_ACTION

FAILED_COLOUR = "#d32f2f"  # a failed tool call's line: readable on light and dark backgrounds
RENDER_INTERVAL_MS = 40  # at most ~25 re-layouts a second while tokens stream in
WEB_SCHEMES = ("http", "https", "mailto")
# GitHub's dialect with raw HTML read as text (a reply's `<div>` or `</think>` is shown, never
# interpreted) and `_x_` as emphasis, as GitHub renders it, not md4c's underline (MD_FLAG_UNDERLINE),
# which looks like a link
MD_FLAG_UNDERLINE = 0x4000
MARKDOWN = QTextDocument.MarkdownFeature((QTextDocument.MarkdownDialectGitHub.value & ~MD_FLAG_UNDERLINE)
                                         | QTextDocument.MarkdownNoHTML.value)


def images_as_links(doc: QTextDocument) -> None:
    """Each Markdown image becomes a link in words (`[image: alt]` to its address): nothing is fetched,
    and the reader sees what the model pointed at and may open it in a browser."""
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            it += 1
            if frag.charFormat().isImageFormat():
                image = frag.charFormat().toImageFormat()
                if image.name().startswith(IMAGE_SCHEME + ":"):  # the chat's own picture: drawn
                    continue
                cursor = QTextCursor(doc)
                cursor.setPosition(frag.position())
                cursor.setPosition(frag.position() + frag.length(), QTextCursor.KeepAnchor)
                link = QTextCharFormat()
                link.setAnchor(True)
                link.setAnchorHref(image.name())
                link.setFontUnderline(True)
                alt = image.property(QTextFormat.ImageAltText) or image.name()
                cursor.insertText(f"[image: {alt}]", link)
        block = block.next()


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
        self.model_names: dict[str, str] = {}  # id -> name, for the model under each reply (the chat view's)
        self.image_source = None  # sha256 -> the thumbnail of a message's image (ui/chat_images.py sets it)
        self._notice = ""
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

    def set_notice(self, text: str) -> None:
        """A line above the chat, e.g. that its model completes text rather than chats ("": none)."""
        if text != self._notice:
            self._notice = text
            self.render_now()

    def schedule_render(self) -> None:
        if not self._render_timer.isActive():
            self._render_timer.start()

    def render_now(self) -> None:
        self._render_timer.stop()
        self._rendering = True
        try:
            self.document().setMarkdown(to_markdown(self._messages, self._actions, self.model_names, self._notice),
                                        MARKDOWN)
            images_as_links(self.document())
            self._style_code_blocks()
        finally:
            self._rendering = False
        if self._stick_to_end:
            self.scroll_to_end()

    def scroll_to_end(self) -> None:
        self.moveCursor(QTextCursor.End)  # QTextEdit's first show scrolls to the cursor: keep it at the end
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt name
        """A live theme switch re-renders: code blocks take their shade and colours from the new palette."""
        super().changeEvent(event)
        if event.type() == QEvent.PaletteChange and not self._rendering and self._messages:
            self.render_now()

    def showEvent(self, event) -> None:  # noqa: N802 - Qt name
        super().showEvent(event)
        if self._stick_to_end:
            self.scroll_to_end()

    def code_block_texts(self, index: int) -> list[str]:
        """The code blocks of message `index`, as the model wrote them (from its Markdown)."""
        blocks, inside, current = [], False, []
        for line in self._messages[index].content.split("\n"):
            if FENCE.match(line):
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
                fmt.setNonBreakableLines(code.language != RESULT_FENCE)  # a tool's long output wraps
                cursor.setBlockFormat(fmt)
                cursor.movePosition(QTextCursor.StartOfBlock)
                cursor.movePosition(QTextCursor.EndOfBlock, QTextCursor.KeepAnchor)
                char = QTextCharFormat()
                char.setFont(mono)
                char.setFontFixedPitch(True)
                cursor.mergeCharFormat(char)
        highlight(doc, dark=self.palette().base().color().lightness() < 128)
        self._style_action_lines()
        self._style_failed_steps()

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

    def _style_failed_steps(self) -> None:
        """A tool call that failed (error, denied, timeout, ...) has its line in red."""
        red = QTextCharFormat()
        red.setForeground(QColor(FAILED_COLOUR))
        block = self.document().begin()
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                href = it.fragment().charFormat().anchorHref()
                it += 1
                if href.startswith(f"{ACTION_SCHEME}:{STEP_ACTION}/") and self._step_failed(href):
                    cursor = QTextCursor(block)
                    cursor.movePosition(QTextCursor.EndOfBlock, QTextCursor.KeepAnchor)
                    cursor.mergeCharFormat(red)
                    break
            block = block.next()

    def _step_failed(self, href: str) -> bool:
        try:
            _, i, n = href.split(":", 1)[1].split("/")
            return self._messages[int(i)].steps[int(n)].failed
        except (ValueError, IndexError):
            return False

    def _on_user_scrolled(self, _action: int) -> None:
        bar = self.verticalScrollBar()  # the position is already the new one; the value follows
        self._stick_to_end = bar.sliderPosition() >= bar.maximum() - 4  # follow the end once back at it

    def _on_range_changed(self, _low: int, high: int) -> None:
        if self._stick_to_end and not self._rendering:
            self.verticalScrollBar().setValue(high)

    def _on_anchor_clicked(self, url: QUrl) -> None:
        if url.scheme() != ACTION_SCHEME:
            if url.scheme() in WEB_SCHEMES:  # a model's link to a file or a program is not followed
                QDesktopServices.openUrl(url)
            return
        parts = url.path().split("/")
        try:
            action, index = parts[0], int(parts[1])
            block = int(parts[2]) if len(parts) > 2 else -1
        except (IndexError, ValueError):
            return
        if action == STEP_ACTION and 0 <= index < len(self._messages):  # open or close a tool call, here
            self._messages[index].opened ^= {block}
            self.render_now()
            return
        if action == WHOLE_ACTION and 0 <= index < len(self._messages):  # a call's whole result, or its start
            self._messages[index].whole ^= {block}
            self.render_now()
            return
        if action == "think" and 0 <= index < len(self._messages):  # open or close the thoughts, here
            self._messages[index].show_thinking = not self._messages[index].show_thinking
            self.render_now()
            return
        self.action_requested.emit(action, index, block)

    def loadResource(self, kind: int, url: QUrl):  # noqa: N802 - Qt name
        """Nothing named in a message is ever fetched or read: `![x](http://…)` or a local path stays an
        empty image, so a reply cannot make the app touch the network or the disk. Only the chat's own
        images (`ember-image:<sha256>`, kept in the history's folder) are drawn, as thumbnails."""
        if url.scheme() == IMAGE_SCHEME and self.image_source is not None:
            return self.image_source(url.path())
        return None

    def plain_text(self) -> str:
        return self.toPlainText()

    def sizeHint(self):  # noqa: N802 - Qt name
        hint = super().sizeHint()
        hint.setWidth(max(hint.width(), 480))
        return hint
