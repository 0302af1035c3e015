"""sys.excepthook that logs an uncaught error and shows it in a dialog (instead of dying silently)."""
from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path
from types import TracebackType

from PySide6.QtWidgets import QApplication, QMessageBox

log = logging.getLogger("ember")


class CrashReporter:
    """Installed as sys.excepthook; keeps the dialogs it shows alive (they are not modal)."""

    def __init__(self, log_path: Path | None = None) -> None:
        self.log_path = log_path
        self.dialogs: list[QMessageBox] = []
        self._previous = sys.excepthook

    def install(self) -> None:
        sys.excepthook = self

    def uninstall(self) -> None:
        if sys.excepthook is self:
            sys.excepthook = self._previous

    def __call__(self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if issubclass(exc_type, KeyboardInterrupt):
            self._previous(exc_type, exc, tb)
            return
        log.critical("uncaught error", exc_info=(exc_type, exc, tb))
        if QApplication.instance() is None:
            self._previous(exc_type, exc, tb)
            return
        box = QMessageBox(QMessageBox.Critical, "Ember hit an error",
                          f"Something went wrong: {exc_type.__name__}: {exc}\n\n"
                          "Your chats are saved. You can keep working; if things look wrong, restart Ember.")
        if self.log_path is not None:
            box.setInformativeText(f"Details are in {self.log_path}")
        box.setDetailedText("".join(traceback.format_exception(exc_type, exc, tb)))
        box.finished.connect(lambda _r, b=box: self.dialogs.remove(b) if b in self.dialogs else None)
        self.dialogs.append(box)
        box.show()
