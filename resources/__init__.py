"""Ember's plain-file resources (icons, stylesheet, catalog), found through `resource_path` only.

Standard library only, so the GUI, the app and the engine can all ask. In a PyInstaller bundle
the folder travels as plain files under sys._MEIPASS (packaging/ember.spec), where this module's
own __file__ points too; the explicit branch says so rather than relying on it.
"""
from __future__ import annotations

import sys
from pathlib import Path


def resource_path(name: str) -> Path:
    """Absolute path of `resources/<name>`, from a source tree, an installed package or a bundle."""
    if getattr(sys, "frozen", False) and hasattr(sys, "_MEIPASS"):
        return Path(sys._MEIPASS) / "resources" / name
    return Path(__file__).resolve().parent / name
