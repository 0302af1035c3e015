"""One passage a reply was given: its text, file and location, and "Open file", which opens the
local file it was uploaded from in the user's own viewer (a PDF at its page where that viewer takes one).

The local path is the vector-store file's `path` attribute (the window's uploads keep it); when the
source does not carry it, a worker asks the engine for it. Nothing here touches the network on the
GUI thread."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from PySide6.QtCore import QProcess, Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

from app.client import EngineClient
from app.doc_sources import Source
from ui.workers import FunctionWorker

# PDF viewers that take a page on their command line (Linux): the desktop file's name -> arguments
PAGE_ARGS = {"evince": ["--page-index={page}"], "okular": ["-p", "{page}"], "zathura": ["-P", "{page}"],
             "atril": ["--page-index={page}"], "xreader": ["--page-index={page}"]}


def viewer_command(path: Path, page: int | None) -> list[str] | None:
    """The default PDF viewer's command that opens `path` at `page`, when it is one that can; else None
    (the file is then opened plainly). Runs a short program: call it off the GUI thread."""
    if page is None or path.suffix.lower() != ".pdf" or not sys.platform.startswith("linux") \
            or shutil.which("xdg-mime") is None:
        return None
    try:
        desktop = subprocess.run(["xdg-mime", "query", "default", "application/pdf"], capture_output=True,
                                 text=True, timeout=3).stdout.strip().lower()
    except (OSError, subprocess.SubprocessError):
        return None
    for name, args in PAGE_ARGS.items():
        if name in desktop and (exe := shutil.which(name)):
            return [exe, *(a.format(page=page) for a in args), str(path)]
    return None


def local_path(client: EngineClient | None, source: Source) -> tuple[str, list[str] | None]:
    """(the file's local path or "", the command that opens it at its page or None)."""
    path = source.path
    if not path and client is not None and source.vector_store_id:
        attrs = client.vector_store_file(source.vector_store_id, source.file_id).get("attributes") or {}
        path = str(attrs.get("path") or "")
    if not path:
        return "", None
    return path, viewer_command(Path(path), source.page)


class SourceDialog(QDialog):
    def __init__(self, source: Source, client: EngineClient | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.source, self._client = source, client
        self._worker: FunctionWorker | None = None
        self._found: tuple[str, list[str] | None] | None = None  # (local path or "", viewer command)
        self._open_asked = False
        self.setWindowTitle(f"Source [{source.index}]: {source.filename}")
        self.header = QLabel(self, textFormat=Qt.PlainText, wordWrap=True)
        self.header.setText(f"[{source.index}]  {source.label}")
        font = self.header.font()
        font.setBold(True)
        self.header.setFont(font)
        self.where = QLabel(self, textFormat=Qt.PlainText, wordWrap=True)
        self.where.setText(source.path or "")
        self.where.setVisible(bool(source.path))
        self.text = QPlainTextEdit(source.text.strip(), self, readOnly=True)
        self.text.setMinimumSize(480, 220)
        self.note = QLabel(self, textFormat=Qt.PlainText, wordWrap=True)
        self.note.hide()
        buttons = QDialogButtonBox(QDialogButtonBox.Close, self)
        self.open_button = buttons.addButton("Open file", QDialogButtonBox.ActionRole)
        self.open_button.setToolTip(f"Open {source.filename}" + (f" at page {source.page}" if source.page else "")
                                    + " in its viewer")
        self.open_button.clicked.connect(self.open_file)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        for w in (self.header, self.where, self.text, self.note, buttons):
            layout.addWidget(w)

    def showEvent(self, event) -> None:  # noqa: N802 - Qt name
        super().showEvent(event)
        if self._found is None and self._worker is None:
            self._look_up()

    def _look_up(self) -> None:
        """Where the file is on this computer (a worker: the engine may have to say)."""
        self._worker = FunctionWorker(local_path, self._client, self.source)
        self._worker.returned.connect(self._on_found)
        self._worker.errored.connect(lambda e: self._on_found(("", None)))
        self._worker.start()

    def _on_found(self, found: tuple[str, list[str] | None]) -> None:
        self._found, self._worker = found, None
        self.where.setText(found[0])
        self.where.setVisible(bool(found[0]))
        if self._open_asked:
            self.open_file()

    def open_file(self) -> None:
        """Open the local file in the user's viewer (once its place is known)."""
        if self._found is None:
            self._open_asked = True
            if self._worker is None:
                self._look_up()
            return
        self._open_asked = False
        path, command = self._found
        if not path or not Path(path).exists():
            self._say("This file was not added from this computer, or it has been moved or deleted since."
                      if not path else f"{path} is no longer there: it was moved or deleted.")
            return
        if command is not None and QProcess.startDetached(command[0], command[1:])[0]:
            return
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(path)):
            self._say(f"No program opens {Path(path).name} here.")

    def _say(self, text: str) -> None:
        self.note.setText(text)
        self.note.show()
