"""The engine's actions, each in a worker: Load and Unload one at a time per model (unloading one model
never waits for another's load: the engine holds several at once), and stopping or restarting the
engine, which waits for nothing else and lets nothing else start meanwhile."""
from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from app.client import EngineClient
from ui.error_words import load_failure_words
from ui.workers import FunctionWorker

log = logging.getLogger(__name__)

ENGINE = "\0engine"  # the key of a stop or restart: the whole engine


class EngineActions(QObject):
    """`load_finished` / `unload_finished` (model id, "" when it worked, else what failed in words);
    `message` for the status bar; `done` after any action (the controller polls then)."""

    load_finished = Signal(str, str)
    unload_finished = Signal(str, str)  # the id is "" for "every model"
    message = Signal(str)
    done = Signal()

    def __init__(self, client: Callable[[], EngineClient | None], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._client = client
        self._workers: dict[str, FunctionWorker] = {}  # model id (or ENGINE) -> its action in flight

    def busy(self, key: str) -> bool:
        """An action on `key` (or on the whole engine) is in flight; for ENGINE: any action."""
        keys = list(self._workers) if key == ENGINE else [key, ENGINE]
        return any(k in self._workers and not self._workers[k].is_finished for k in keys)

    def load(self, model_id: str) -> FunctionWorker | None:
        """Load beside the models already loaded; `load_finished` says how it ended."""
        client = self._client()
        if client is None:
            return None
        return self._run(model_id, client.load_model, (model_id,), self.load_finished,
                         lambda e: load_failure_words(model_id, e))

    def unload(self, model_id: str | None) -> FunctionWorker | None:
        """Unload one model once its replies end (None: every model); `unload_finished` says how it ended."""
        client = self._client()
        if client is None:
            return None
        return self._run(model_id or "", client.unload_model, (model_id,), self.unload_finished,
                         lambda e: f"Could not unload {model_id or 'the models'}: {getattr(e, 'message', None) or e}")

    def engine(self, func: Callable[[], object]) -> FunctionWorker | None:
        """Stop or restart the engine (the supervisor's call, blocking: in a worker)."""
        return self._run(ENGINE, func, (), None, str)

    def quit(self) -> None:
        for worker in self._workers.values():
            worker.quit()

    def _run(self, key: str, func: Callable, args: tuple, finished: Signal | None,
             words: Callable[[Exception], str]) -> FunctionWorker | None:
        if self.busy(key):
            self.message.emit("The engine is busy with another action; try again in a moment.")
            return None
        worker = FunctionWorker(func, *args)
        if finished is not None:
            worker.returned.connect(lambda _body: finished.emit(key, ""))
        worker.errored.connect(lambda e: self._on_error(key, finished, words(e)))
        worker.finished.connect(self.done)
        self._workers[key] = worker
        worker.start()
        return worker

    def _on_error(self, key: str, finished: Signal | None, words: str) -> None:
        log.warning("engine action failed: %s", words)
        self.message.emit(words)
        if finished is not None:
            finished.emit(key, words)
