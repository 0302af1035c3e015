"""Engine → Engine log…: the end of the engine's log file and the app's, with Ember's version."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices, QFontDatabase, QGuiApplication, QTextCursor, QTextOption
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QPushButton, QTabWidget,
                               QVBoxLayout, QWidget)

from app.version import ember_version

TAIL_BYTES = 128 << 10  # the end of a log is what explains a problem; the file itself may be larger


def read_tail(path: Path, limit: int = TAIL_BYTES) -> str:
    """The last `limit` bytes of a text file, from a line start; a note when it does not exist yet."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError:
        return f"(no log yet at {path})"
    if size > limit:
        data = data.split(b"\n", 1)[-1]
    return data.decode("utf-8", errors="replace")


class EngineLogDialog(QDialog):
    """Two read-only tabs (engine, app); Refresh re-reads the files, Open folder shows them."""

    def __init__(self, engine_log: Path, app_log: Path, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Engine log")
        self.resize(820, 520)
        self.files = {"Engine": Path(engine_log), "App": Path(app_log)}
        self.logs_dir = self.files["Engine"].parent
        self.version_label = QLabel(f"Ember {ember_version()} · logs in {self.logs_dir}", self,
                                    objectName="versionLabel", wordWrap=True)
        self.tabs = QTabWidget(self)
        self.views: dict[str, QPlainTextEdit] = {}
        mono = QFontDatabase.systemFont(QFontDatabase.FixedFont)
        for name in self.files:
            view = QPlainTextEdit(self, readOnly=True)
            view.setFont(mono)
            view.setLineWrapMode(QPlainTextEdit.WidgetWidth)  # a long traceback line is read, not scrolled to
            view.setWordWrapMode(QTextOption.WrapAtWordBoundaryOrAnywhere)
            self.views[name] = view
            self.tabs.addTab(view, name)
        buttons = QDialogButtonBox(QDialogButtonBox.Close, self)
        self.refresh_button = QPushButton("Refresh", self)
        self.open_button = QPushButton("Open folder", self)
        buttons.addButton(self.refresh_button, QDialogButtonBox.ActionRole)
        buttons.addButton(self.open_button, QDialogButtonBox.ActionRole)
        layout = QVBoxLayout(self)
        layout.addWidget(self.version_label)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(buttons)
        buttons.rejected.connect(self.reject)
        self.refresh_button.clicked.connect(self.refresh)
        self.open_button.clicked.connect(self._on_open_folder)
        self.refresh()

    def refresh(self) -> None:
        for name, path in self.files.items():
            view = self.views[name]
            view.setPlainText(read_tail(path))
            view.moveCursor(QTextCursor.End)  # the latest lines first in view
            view.ensureCursorVisible()

    def _on_open_folder(self) -> None:
        """The folder in the file manager; where none opens it, its path, to copy."""
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.logs_dir))):
            QGuiApplication.clipboard().setText(str(self.logs_dir))
            self.version_label.setText(f"No file manager opened the folder. The logs are in {self.logs_dir} "
                                       "(the path is on the clipboard).")
