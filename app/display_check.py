"""Can the desktop window start here? A missing display or missing Qt libraries, said in one line.

Qt's xcb platform plugin (X11) needs a few system libraries that minimal Debian/Ubuntu installs
lack; without them Qt aborts with a long message. `ember` checks first and falls back to the
terminal chat instead. Qt-free (ctypes.util only), so the check itself cannot crash the same way.
"""
from __future__ import annotations

import ctypes.util
import os
import sys
from collections.abc import Callable, Mapping

# shared library name (for ctypes.util.find_library) -> the Debian/Ubuntu package that ships it
XCB_LIBS = {"xcb-cursor": "libxcb-cursor0", "xcb-icccm": "libxcb-icccm4", "xcb-keysyms": "libxcb-keysyms1",
            "xcb-image": "libxcb-image0", "xcb-render-util": "libxcb-render-util0", "xcb-xkb": "libxcb-xkb1",
            "xkbcommon-x11": "libxkbcommon-x11-0", "EGL": "libegl1", "fontconfig": "libfontconfig1"}


def gui_problem(env: Mapping[str, str] | None = None, platform: str | None = None,
                find_library: Callable[[str], str | None] = ctypes.util.find_library) -> str | None:
    """None when the window can start; else one line saying why and what to install."""
    env = os.environ if env is None else env
    platform = platform or sys.platform
    qpa = env.get("QT_QPA_PLATFORM", "")
    if not platform.startswith("linux") or qpa in ("offscreen", "minimal", "vnc"):
        return None
    wayland = bool(env.get("WAYLAND_DISPLAY")) and qpa.startswith("wayland")
    if not env.get("DISPLAY") and not env.get("WAYLAND_DISPLAY"):
        return "no display (DISPLAY and WAYLAND_DISPLAY are not set)"
    if wayland:
        return None
    missing = [pkg for lib, pkg in XCB_LIBS.items() if find_library(lib) is None]
    if missing:
        return (f"Qt's X11 plugin needs system libraries that are missing; install them with: "
                f"sudo apt install {' '.join(missing)}")
    return None
