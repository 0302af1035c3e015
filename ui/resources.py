"""The GUI's icons, stylesheet and palettes, from the plain-file resources that
resources.resource_path finds (no rcc step, as napari)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QIcon, QPalette
from PySide6.QtWidgets import QApplication, QToolTip

from app.supervisor import SupervisorState
from resources import resource_path
from ui.engine_controller import REMOTE


def icon(name: str) -> QIcon:
    """`resources/icons/<name>.svg` as a QIcon."""
    return QIcon(str(resource_path(f"icons/{name}.svg")))


def engine_state_icon(state: str) -> QIcon:
    """The tray/status icon for an engine state (a SupervisorState or REMOTE)."""
    if state == REMOTE:
        return icon("remote")
    return icon(f"engine-{state if state in set(SupervisorState) else SupervisorState.STOPPED}")


def _dark_palette() -> QPalette:
    p = QPalette()
    colors = {
        QPalette.Window: "#25262b", QPalette.WindowText: "#e9ecef", QPalette.Base: "#1a1b1e",
        QPalette.AlternateBase: "#2c2e33", QPalette.Text: "#e9ecef", QPalette.Button: "#2c2e33",
        QPalette.ButtonText: "#e9ecef", QPalette.Highlight: "#e8590c",
        QPalette.HighlightedText: "#ffffff", QPalette.ToolTipBase: "#2c2e33",
        QPalette.ToolTipText: "#e9ecef", QPalette.PlaceholderText: "#868e96",
        QPalette.Link: "#ffa94d", QPalette.Mid: "#373a40", QPalette.Dark: "#141517",
    }
    for role, color in colors.items():
        p.setColor(role, QColor(color))
    for role in (QPalette.Text, QPalette.ButtonText, QPalette.WindowText):  # muted, still legible on Window
        p.setColor(QPalette.Disabled, role, QColor("#7c8089"))
    return p


def _light_palette() -> QPalette:
    p = QPalette()
    colors = {
        QPalette.Window: "#f8f9fa", QPalette.WindowText: "#212529", QPalette.Base: "#ffffff",
        QPalette.AlternateBase: "#f1f3f5", QPalette.Text: "#212529", QPalette.Button: "#f1f3f5",
        QPalette.ButtonText: "#212529", QPalette.Highlight: "#e8590c",
        QPalette.HighlightedText: "#ffffff", QPalette.PlaceholderText: "#868e96",
        QPalette.Link: "#d9480f", QPalette.Mid: "#ced4da", QPalette.Dark: "#adb5bd",
        QPalette.ToolTipBase: "#ffffff", QPalette.ToolTipText: "#212529",
    }
    for role, color in colors.items():
        p.setColor(role, QColor(color))
    return p


def apply_theme(app: QApplication, theme: str) -> None:
    """Fusion + a light or dark palette; style.qss refers to palette roles so it follows both.

    "system" follows the platform's colour scheme (dark or light) where it reports one.
    """
    app.setStyle("Fusion")
    if theme == "system":
        theme = "dark" if app.styleHints().colorScheme() == Qt.ColorScheme.Dark else "light"
    palette = _dark_palette() if theme == "dark" else _light_palette()
    app.setPalette(palette)
    QToolTip.setPalette(palette)  # tooltips and the tray's notice balloon keep their own palette
    app.setStyleSheet(resource_path("style.qss").read_text(encoding="utf-8"))
