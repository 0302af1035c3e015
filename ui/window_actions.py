"""The main window's menus and keyboard shortcuts, in one place (the platform's conventions).

Ctrl+N new chat · Ctrl+R regenerate · Escape stop the reply · Ctrl+F search chats ·
Ctrl+M model manager · Ctrl+Shift+D documents · Ctrl+, settings · Ctrl+W close the window · Ctrl+Q quit.
Every menu says "engine" for the background process (the tray and the messages do too).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMenu


@dataclass
class WindowActions:
    new_chat: QAction
    export_md: QAction
    export_json: QAction
    regenerate: QAction
    stop: QAction
    search: QAction
    models: QAction
    documents: QAction
    settings: QAction
    engine_log: QAction
    about: QAction


def _action(parent: QObject, menu: QMenu, text: str, slot: Callable, *shortcuts) -> QAction:
    a = QAction(text, parent)
    keys: list[QKeySequence] = []
    for s in shortcuts:  # a platform key that is empty here, or the same as another, is left out
        for k in QKeySequence.keyBindings(s) if isinstance(s, QKeySequence.StandardKey) else [QKeySequence(s)]:
            if not k.isEmpty() and k not in keys:
                keys.append(k)
    if keys:
        a.setShortcuts(keys)
    a.triggered.connect(lambda *_: slot())
    menu.addAction(a)
    return a


def build_menus(window: QMainWindow, *, new_chat: Callable, export: Callable[[str], None],
                regenerate: Callable, stop: Callable, search: Callable, models: Callable, settings: Callable,
                engine_log: Callable, about: Callable, engine, documents: Callable = lambda: None) -> WindowActions:
    """Fill `window`'s menu bar; `engine` is the EngineController (start/stop/restart, quit)."""
    bar = window.menuBar()
    file_menu = bar.addMenu("&File")
    new = _action(window, file_menu, "New chat", new_chat, QKeySequence.New, "Ctrl+N")
    md = _action(window, file_menu, "Export chat as Markdown…", lambda: export("md"))
    js = _action(window, file_menu, "Export chat as JSON…", lambda: export("json"))
    file_menu.addSeparator()
    prefs = _action(window, file_menu, "Settings…", settings, "Ctrl+,", QKeySequence.Preferences)
    file_menu.addSeparator()
    _action(window, file_menu, "Close window", window.close, QKeySequence.Close)
    _action(window, file_menu, "Quit Ember", engine.request_quit, QKeySequence.Quit)

    chat_menu = bar.addMenu("&Chat")
    regen = _action(window, chat_menu, "Regenerate reply", regenerate, "Ctrl+R")
    stop_a = _action(window, chat_menu, "Stop reply", stop, "Escape")
    find = _action(window, chat_menu, "Search chats", search, QKeySequence.Find, "Ctrl+F")

    models_menu = bar.addMenu("&Models")
    models_a = _action(window, models_menu, "Model manager…", models, "Ctrl+M")
    docs_a = _action(window, models_menu, "Documents…", documents, "Ctrl+Shift+D")

    engine_menu = bar.addMenu("&Engine")
    _action(window, engine_menu, "Start engine", engine.start_server)
    _action(window, engine_menu, "Stop engine", engine.stop_server)
    _action(window, engine_menu, "Restart engine", engine.restart_server)
    engine_menu.addSeparator()
    log = _action(window, engine_menu, "Engine log…", engine_log)

    about_a = _action(window, bar.addMenu("&Help"), "About Ember", about)
    return WindowActions(new, md, js, regen, stop_a, find, models_a, docs_a, prefs, log, about_a)
