"""How this program runs itself again, from a source tree or frozen in a PyInstaller bundle.

In a bundle (packaging/ember.spec) sys.executable is Ember itself, not a Python that takes `-m`:
the desktop app's engine child is then `<exe> engine-child ...`, a command app.cli keeps out of
its help. Standard library only: app.cli reads ENGINE_CHILD_COMMAND before parsing anything.
"""
from __future__ import annotations

import sys

ENGINE_CHILD_COMMAND = "engine-child"  # `ember engine-child --parent-pid P serve ...`: app.engine_child


def is_frozen() -> bool:
    return bool(getattr(sys, "frozen", False))


def ember_command() -> list[str]:
    """`ember`: the program itself when frozen, else this Python with `-m app`."""
    return [sys.executable] if is_frozen() else [sys.executable, "-m", "app"]


def engine_child_command() -> list[str]:
    """app.engine_child: `<exe> engine-child` when frozen, else `python -m app.engine_child` (no
    argparse in front of it, so it starts fast)."""
    return [sys.executable, ENGINE_CHILD_COMMAND] if is_frozen() else [sys.executable, "-m", "app.engine_child"]
