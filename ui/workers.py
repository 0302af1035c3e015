"""Run plain, Qt-free functions and generators off the GUI thread (the shape of superqt's workers).

The work itself never sees Qt: a worker calls it on a pool thread and reports through signals,
which Qt delivers to GUI-thread slots by queued connection. Be careful not to touch any widget
from the work: it runs on another thread.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Generator, Iterator

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal

log = logging.getLogger(__name__)

# Several chats stream at once, each holding a thread while it waits on the socket; the global
# pool defaults to one thread per core, which on a 2-core machine would queue the third stream.
MIN_POOL_THREADS = 32


def thread_pool() -> QThreadPool:
    pool = QThreadPool.globalInstance()
    if pool.maxThreadCount() < MIN_POOL_THREADS:
        pool.setMaxThreadCount(MIN_POOL_THREADS)
    return pool


class WorkerSignals(QObject):
    """Lives on the GUI thread; emitted from the pool thread, so receivers get queued calls."""

    started = Signal()
    yielded = Signal(object)
    returned = Signal(object)
    errored = Signal(object)  # the exception
    finished = Signal()


class _WorkerBase(QRunnable):
    def __init__(self) -> None:
        super().__init__()
        self.setAutoDelete(True)  # Qt frees the C++ side after run(); views keep the Python side
        self.signals = WorkerSignals()
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
        self._running = True
        thread_pool().start(self)

    def run(self) -> None:  # called on the pool thread
        self.signals.started.emit()
        try:
            result = self.work()
        except Exception as e:  # reported, never raised into Qt's thread
            log.debug("worker failed", exc_info=True)
            self.signals.errored.emit(e)
        else:
            if not self._abort_requested:
                self.signals.returned.emit(result)
        finally:
            self._running = False
            self._finished = True
            self.signals.finished.emit()

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
                self.signals.yielded.emit(item)
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
