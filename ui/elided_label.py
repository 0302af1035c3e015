"""A QLabel that shortens its text with "…" instead of widening its window (after superqt's QElidingLabel).

A plain QLabel's minimum width is its whole text, so a status line that grows pushes the main
window wider. This one asks for its text's width but accepts as little as a few characters.
"""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

MIN_CHARS = 4


class ElidedLabel(QLabel):
    """The full text stays in `text()` and in the tooltip when it does not fit."""

    def __init__(self, text: str = "", parent: QWidget | None = None, **properties) -> None:
        super().__init__(text, parent, **properties)
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Preferred)

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt name
        hint = super().minimumSizeHint()
        if not self.text():
            return QSize(0, hint.height())
        return QSize(min(hint.width(), self.fontMetrics().averageCharWidth() * MIN_CHARS), hint.height())

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt name
        rect = self.contentsRect().adjusted(self.margin(), 0, -self.margin(), 0)
        full = self.text()
        if self.fontMetrics().horizontalAdvance(full) <= rect.width():
            super().paintEvent(event)
            return
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(rect, int(self.alignment() | Qt.AlignVCenter),
                         self.fontMetrics().elidedText(full, Qt.ElideRight, rect.width()))
