"""Run plain, Qt-free functions and generators off the GUI thread (the shape of superqt's workers).

The work itself never sees Qt: a worker calls it on its own thread and reports through signals,
emitted on the GUI thread (the worker thread only posts them there through `gui_calls()`, never
entering Qt itself: see ui/gui_thread.py for the deadlock that avoids). Be careful not to touch any
widget from the work: it runs on another thread.

Each worker runs on its own daemon `threading.Thread` rather than in a QThreadPool: the thread
holds the worker until `run()` returns, so a view may drop a worker (a stopped chat) at any time,
and a pool sized to the cores would queue the third of several streaming chats.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Generator, Iterator

from PySide6.QtCore import QObject, Signal

from ui.gui_thread import gui_calls

log = logging.getLogger(__name__)


class WorkerSignals(QObject):
    """Lives on the GUI thread and is emitted there: the worker thread posts each emit."""

    started = Signal()
    yielded = Signal(object)
    returned = Signal(object)
    errored = Signal(object)  # the exception
    finished = Signal()


class _WorkerBase:
    def __init__(self) -> None:
        self.signals = WorkerSignals()
        self._gui = gui_calls()  # made here, on the GUI thread
        self._thread: threading.Thread | None = None
        self._abort_requested = False
        self._running = False
        self._finished = False

    # signal shortcuts, like superqt (`worker.yielded.connect(...)`)
    @property
    def started(self) -> Signal:
        return self.signals.started

    @property
    def yielded(self) -> Signal:
        return self.signals.yielded

    @property
    def returned(self) -> Signal:
        return self.signals.returned

    @property
    def errored(self) -> Signal:
        return self.signals.errored

    @property
    def finished(self) -> Signal:
        return self.signals.finished

    @property
    def abort_requested(self) -> bool:
        return self._abort_requested

    @property
    def is_running(self) -> bool:
        return self._running

    @property
    def is_finished(self) -> bool:
        return self._finished

    def quit(self) -> None:
        """Ask the work to stop; a generator sees it before its next item."""
        self._abort_requested = True

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("a worker runs once")
        self._running = True
        self._thread = threading.Thread(target=self.run, name=f"ui-worker-{type(self).__name__}", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the work to end (tests and shutdown); True when it has."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self._finished

    def run(self) -> None:  # called on the worker thread
        self._gui.post(self.signals.started.emit)
        error: Exception | None = None
        try:
            result = self.work()
        except Exception as e:  # reported, never raised into Qt's thread
            log.debug("worker failed", exc_info=True)
            error = e
        finally:
            # Finished before the outcome is emitted: a slot that receives `returned` (on the GUI
            # thread, later) must see the work as over, or it could refuse the next job as "busy"
            # while this thread has not yet been scheduled to run its last lines.
            self._running = False
            self._finished = True
        if error is not None:
            self._gui.post(self.signals.errored.emit, error)
        elif not self._abort_requested:
            self._gui.post(self.signals.returned.emit, result)
        self._gui.post(self.signals.finished.emit)

    def work(self) -> Any:
        raise NotImplementedError


class FunctionWorker(_WorkerBase):
    """Calls `func(*args, **kwargs)` once; `returned` carries its result."""

    def __init__(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self._func, self._args, self._kwargs = func, args, kwargs

    def work(self) -> Any:
        return self._func(*self._args, **self._kwargs)


class GeneratorWorker(_WorkerBase):
    """Iterates a generator: `yielded` per item, `returned` with its return value.

    `quit()` is checked between items; the generator is then closed, so its `finally` (or an
    iterator's `close()`, e.g. the HTTP stream aborting its request) runs on the worker thread.
    """

    def __init__(self, func: Callable[..., Iterator[Any] | Generator[Any, Any, Any]],
                 *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self._func, self._args, self._kwargs = func, args, kwargs

    def work(self) -> Any:
        gen = self._func(*self._args, **self._kwargs)
        it = iter(gen)
        try:
            while True:
                if self._abort_requested:
                    return None
                try:
                    item = next(it)
                except StopIteration as stop:
                    return stop.value
                if self._abort_requested:
                    return None
                self._gui.post(self.signals.yielded.emit, item)
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                close()


def create_worker(func: Callable[..., Any], *args: Any, **kwargs: Any) -> _WorkerBase:
    """A GeneratorWorker when `func` is a generator function, else a FunctionWorker (not started)."""
    import inspect

    if inspect.isgeneratorfunction(func):
        return GeneratorWorker(func, *args, **kwargs)
    return FunctionWorker(func, *args, **kwargs)


class WorkerSet:
    """Starts workers and holds each until it ends, so a view that fires and forgets them (a refresh,
    an upload) never has one collected mid-run; `slots` connect its signals by name."""

    def __init__(self) -> None:
        self._running: set[_WorkerBase] = set()

    def run(self, worker: _WorkerBase, **slots: Callable[..., Any]) -> _WorkerBase:
        for name, slot in slots.items():
            getattr(worker, name).connect(slot)
        self._running.add(worker)
        worker.finished.connect(lambda: self._running.discard(worker))
        worker.start()
        return worker

    def join(self, timeout: float = 10.0) -> None:
        """Wait for every worker (tests, closing)."""
        for worker in list(self._running):
            worker.join(timeout)
