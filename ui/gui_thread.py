"""Hand calls from any Python thread to the GUI thread without touching Qt on the calling thread.

Why not a queued signal: emitting one from a Python thread takes Qt's signal-slot lock, and inside
it PySide takes the GIL (to read the sender's meta-object, or to copy a Python argument into the
queued event). If the GUI thread meanwhile holds the GIL and waits for that lock (Shiboken deleting,
on the GUI thread, a QObject whose wrapper was garbage-collected on another thread), each thread
waits for the other forever: the whole window freezes. This hang was caught under gdb in a
download test (a download thread emitting, the GUI thread in `runDeletionInMainThread`).

Here the calling thread only appends to a queue and writes a byte to a socket (the self-pipe
trick); a QSocketNotifier on the GUI thread wakes, drains the queue in order and makes the calls.
A socket pair rather than a pipe so that the notifier works on Windows too.
"""
from __future__ import annotations

import logging
import queue
import socket
from typing import Any, Callable

import shiboken6
from PySide6.QtCore import QCoreApplication, QObject, QSocketNotifier, QThread

log = logging.getLogger(__name__)


class GuiThreadCalls(QObject):
    """A FIFO of calls made on the thread this object was created on (the GUI thread)."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._calls: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]] = queue.SimpleQueue()
        self._wake_read, self._wake_write = socket.socketpair()
        for end in (self._wake_read, self._wake_write):
            end.setblocking(False)
        self._notifier = QSocketNotifier(self._wake_read.fileno(), QSocketNotifier.Type.Read, self)
        self._notifier.activated.connect(self._drain)

    def post(self, func: Callable[..., Any], *args: Any) -> None:
        """Call `func(*args)` on the GUI thread, after every call posted before it. Any thread."""
        self._calls.put((func, args))
        try:
            self._wake_write.send(b"\0")
        except (BlockingIOError, OSError):  # buffer full: a wake-up is already pending; or closed at exit
            pass

    def call(self, func: Callable[..., Any], *args: Any) -> None:
        """Like Qt's AutoConnection: at once when already on the GUI thread, else `post`."""
        if QThread.currentThread() is self.thread():
            func(*args)
        else:
            self.post(func, *args)

    def _drain(self) -> None:
        # Read the wake-up bytes before taking calls: a call posted after this read writes a new
        # byte, so the notifier fires again; one posted before it is taken below. No call is missed.
        try:
            while self._wake_read.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass
        while True:
            try:
                func, args = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                func(*args)
            except Exception as e:
                if isinstance(e, RuntimeError) and "deleted" in str(e):
                    # its object's C++ side is gone (a closed chat): dropped, as Qt drops a queued signal
                    log.debug("dropped a call for a deleted object: %s", e)
                else:
                    log.exception("a call posted to the GUI thread failed")


_instance: GuiThreadCalls | None = None


def gui_calls() -> GuiThreadCalls:
    """The application's GuiThreadCalls; made on first use, which must be on the GUI thread."""
    global _instance
    app = QCoreApplication.instance()
    if app is None:
        raise RuntimeError("gui_calls() needs a QApplication")
    if _instance is None or not shiboken6.isValid(_instance):  # none yet, or its application has gone
        if QThread.currentThread() is not app.thread():
            raise RuntimeError("gui_calls() is first called on the GUI thread")
        _instance = GuiThreadCalls(app)
    return _instance
