"""A small live line chart of recent throughput, drawn with QPainter."""
from __future__ import annotations

from collections import deque

from PySide6.QtCore import QPointF, QSize
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QWidget


class Sparkline(QWidget):
    """The last `capacity` values, scaled to the largest one shown (so a burst stays readable)."""

    def __init__(self, capacity: int = 60, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.values: deque[float] = deque(maxlen=capacity)
        self.setFixedSize(QSize(120, 18))
        self.setToolTip("Engine throughput, tokens per second (all chats together)")

    def clear(self) -> None:
        self.values.clear()
        self.update()

    def add(self, value: float) -> None:
        self.values.append(max(0.0, float(value)))
        self.update()

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt name
        return QSize(120, 20)

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt name
        painter = QPainter(self)
        painter.setRenderHint(QPainter.Antialiasing)
        w, h = self.width(), self.height()
        painter.fillRect(self.rect(), self.palette().base())
        if len(self.values) < 2:
            return
        top = max(self.values) or 1.0
        step = w / (self.values.maxlen - 1)
        x0 = w - step * (len(self.values) - 1)
        points = [QPointF(x0 + i * step, h - 2 - (h - 4) * v / top) for i, v in enumerate(self.values)]
        line = QPainterPath(points[0])
        for p in points[1:]:
            line.lineTo(p)
        area = QPainterPath(line)
        area.lineTo(points[-1].x(), h)
        area.lineTo(points[0].x(), h)
        area.closeSubpath()
        accent = self.palette().highlight().color()
        fill = QColor(accent)
        fill.setAlpha(60)
        painter.fillPath(area, fill)
        painter.setPen(QPen(accent, 1.5))
        painter.drawPath(line)  # a shape, not a figure: the chat's own line says its speed (the tooltip, the engine's)
