"""A file into text sections with their location (a PDF page, a slide), or a DocError in words.

PDFs go through pypdf page by page, so every passage keeps its page number (markitdown's PDF
path runs the whole document together). DOCX, PPTX, XLSX and HTML go through markitdown, which
writes Markdown (headings kept, so the chunker can split on them; a PPTX's slides are marked
`<!-- Slide number: N -->`). Markdown, plain text and source code are read as text: UTF-8, else
the encoding charset_normalizer finds, else refused; a NUL byte means it is not text at all.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MAX_FILE_BYTES = 512 << 20  # a document larger than this is refused before it is read

CODE = frozenset(".py .pyi .c .h .cc .cpp .hpp .cs .java .kt .go .rs .js .jsx .ts .tsx .rb .php .swift .m .scala "
                 ".sh .bash .zsh .ps1 .sql .lua .r .jl .hs .ml .ex .exs .clj .dart .vue .svelte .zig .toml .yaml "
                 ".yml .ini .cfg .json .css .scss .xml".split())
MARKDOWN = frozenset({".md", ".markdown", ".mdx", ".rst"})
TEXT = frozenset({".txt", ".text", ".log", ".csv", ".tsv", ""})
OFFICE = frozenset({".docx", ".pptx", ".xlsx", ".html", ".htm", ".xhtml", ".epub"})
SUPPORTED = CODE | MARKDOWN | TEXT | OFFICE | {".pdf"}
WESTERN = ("cp1252", "latin_1", "iso8859_15")
_SLIDE = re.compile(r"<!-- Slide number: (\d+) -->")


class DocError(ValueError):
    """A file Ember cannot index, with the reason in words (shown to the user as it is)."""


@dataclass(frozen=True, slots=True)
class Section:
    text: str
    location: str  # "page 3", "slide 2", "" (the whole file): a chunk adds its heading or lines


def kind_of(name: str) -> str:
    """'pdf', 'office', 'markdown', 'code' or 'text', by the file name's extension."""
    ext = Path(name).suffix.lower()
    if ext == ".pdf":
        return "pdf"
    if ext in OFFICE:
        return "office"
    if ext in MARKDOWN:
        return "markdown"
    if ext in CODE:
        return "code"
    if ext in TEXT:
        return "text"
    raise DocError(f"{name}: {ext} files are not supported (PDF, DOCX, PPTX, XLSX, HTML, Markdown, text and "
                   "source code are)")


def convert(path: Path, name: str | None = None) -> tuple[str, list[Section]]:
    """(kind, sections) of the file at `path`; `name` (the user's file name) decides its kind."""
    name = name or path.name
    kind = kind_of(name)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise DocError(f"{name}: the file is gone (moved or deleted before it was read)") from None
    if size > MAX_FILE_BYTES:
        raise DocError(f"{name} is {size / 2**30:.1f} GiB, more than the {MAX_FILE_BYTES >> 20} MiB a document "
                       "may be; split it into smaller files")
    if kind == "pdf":
        return kind, _pdf(path, name)
    if kind == "office":
        return "markdown", _office(path, name, Path(name).suffix.lower())
    return kind, [Section(read_text(path, name), "")]


def read_text(path: Path, name: str) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DocError(f"{name}: the file is gone (moved or deleted before it was read)") from None
    if b"\0" in data[:65536]:
        raise DocError(f"{name} is not a text file (it holds binary data)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    matches = list(from_bytes(data))
    if not matches:
        raise DocError(f"{name} is not UTF-8 and its encoding could not be recognised; save it as UTF-8")
    # a short text fits several 8-bit code pages equally well (cp1257 reads French as well as cp1252
    # by charset_normalizer's measures): among the equals, Windows' Western one, the commonest
    best = matches[0]
    equals = [m for m in matches if m.chaos <= best.chaos + 0.1 and m.coherence >= best.coherence - 0.01]
    return str(next((m for m in equals if m.encoding in WESTERN), best))


def _pdf(path: Path, name: str) -> list[Section]:
    from pypdf import PdfReader
    from pypdf.errors import FileNotDecryptedError, PdfReadError

    try:
        reader = PdfReader(path)
        if reader.is_encrypted and not reader.decrypt(""):
            raise DocError(f"{name} is an encrypted PDF with a password; save an unprotected copy to index it")
        pages = [Section(page.extract_text() or "", f"page {i + 1}") for i, page in enumerate(reader.pages)]
    except FileNotDecryptedError:
        raise DocError(f"{name} is an encrypted PDF with a password; save an unprotected copy to index it") from None
    except (PdfReadError, ValueError, KeyError, TypeError, AttributeError) as e:
        if isinstance(e, DocError):
            raise
        raise DocError(f"{name} is not a readable PDF (damaged or cut short: {e})") from None
    pages = [p for p in pages if p.text.strip()]
    if not pages:
        raise DocError(f"{name} has no text layer (a scanned or image-only PDF); Ember does not read text "
                       "in images yet: run OCR on it first")
    return pages


def _office(path: Path, name: str, ext: str) -> list[Section]:
    from markitdown import MarkItDown, StreamInfo

    try:  # the stored file may have no extension (an upload is kept under its id): say which it is
        text = MarkItDown(enable_plugins=False).convert(path, stream_info=StreamInfo(extension=ext)).markdown
    except Exception as e:  # markitdown wraps each converter's own errors
        raise DocError(f"{name} could not be converted ({type(e).__name__}: {str(e)[:200]})") from None
    if not text.strip():
        raise DocError(f"{name} holds no text")
    parts = _SLIDE.split(text)
    if len(parts) == 1:
        return [Section(text, "")]
    sections = [Section(parts[0], "")] if parts[0].strip() else []
    sections += [Section(body, f"slide {n}") for n, body in zip(parts[1::2], parts[2::2]) if body.strip()]
    return sections
