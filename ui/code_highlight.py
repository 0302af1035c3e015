"""Syntax colours for the fenced code blocks of a QTextDocument rendered from Markdown, by pygments.

Qt's Markdown reader turns each line of a fenced block into one QTextBlock carrying the fence and
the language (QTextFormat.BlockCodeFence / BlockCodeLanguage); consecutive such lines are one
code block. Each block is lexed whole (a string or comment may span lines) and the token colours
of a pygments style, light or dark, are merged into the text.
"""
from __future__ import annotations

from dataclasses import dataclass

from pygments.lexers import get_lexer_by_name
from pygments.styles import get_style_by_name
from pygments.util import ClassNotFound
from PySide6.QtGui import QColor, QFont, QTextBlock, QTextCharFormat, QTextCursor, QTextDocument, QTextFormat

LIGHT_STYLE, DARK_STYLE = "friendly", "monokai"
MAX_HIGHLIGHT_CHARS = 20_000  # a huge block stays plain monospace rather than slowing every re-render


@dataclass
class CodeBlock:
    language: str
    blocks: list[QTextBlock]

    @property
    def text(self) -> str:
        return "\n".join(b.text() for b in self.blocks)


def is_code(block: QTextBlock) -> bool:
    fmt = block.blockFormat()
    return fmt.hasProperty(QTextFormat.BlockCodeFence) or fmt.hasProperty(QTextFormat.BlockCodeLanguage) \
        or fmt.nonBreakableLines()


def code_blocks(doc: QTextDocument) -> list[CodeBlock]:
    """The document's code blocks in order (runs of consecutive code lines)."""
    out: list[CodeBlock] = []
    block, run = doc.begin(), None
    while block.isValid():
        if is_code(block):
            if run is None:
                lang = block.blockFormat().property(QTextFormat.BlockCodeLanguage) or ""
                run = CodeBlock(str(lang).strip(), [])
                out.append(run)
            run.blocks.append(block)
        else:
            run = None
        block = block.next()
    return out


def _lexer(language: str):
    """The fence's language; an unlabeled block stays plain (guessing costs ~all lexers, every re-render)."""
    try:
        return get_lexer_by_name(language) if language else None
    except ClassNotFound:
        return None


_formats: dict[tuple[str, object], QTextCharFormat] = {}


def _format(style_name: str, style, token) -> QTextCharFormat:
    key = (style_name, token)
    if key not in _formats:
        spec = style.style_for_token(token)
        fmt = QTextCharFormat()
        if spec["color"]:
            fmt.setForeground(QColor("#" + spec["color"]))
        if spec["bold"]:
            fmt.setFontWeight(QFont.Bold)
        if spec["italic"]:
            fmt.setFontItalic(True)
        _formats[key] = fmt
    return _formats[key]


def highlight(doc: QTextDocument, dark: bool) -> int:
    """Colour every code block of `doc` whose language pygments knows; returns how many."""
    style_name = DARK_STYLE if dark else LIGHT_STYLE
    style = get_style_by_name(style_name)
    done = 0
    for code in code_blocks(doc):
        text = code.text
        if not text.strip() or len(text) > MAX_HIGHLIGHT_CHARS:
            continue
        lexer = _lexer(code.language)
        if lexer is None:
            continue
        lexer.stripnl = lexer.stripall = False
        lexer.ensurenl = False
        starts = [b.position() for b in code.blocks]
        line, col = 0, 0
        cursor = QTextCursor(doc)
        for token, value in lexer.get_tokens(text):
            for i, piece in enumerate(value.split("\n")):
                if i:
                    line, col = line + 1, 0
                if piece and line < len(starts):
                    fmt = _format(style_name, style, token)
                    if fmt.foreground().style() != 0 or fmt.fontWeight() == QFont.Bold or fmt.fontItalic():
                        cursor.setPosition(starts[line] + col)
                        cursor.setPosition(starts[line] + col + len(piece), QTextCursor.KeepAnchor)
                        cursor.mergeCharFormat(fmt)
                col += len(piece)
        done += 1
    return done
