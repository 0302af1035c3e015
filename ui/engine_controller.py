"""The GUI's handle on the engine: local (through app.supervisor) or a remote OpenAI-compatible server.

Qt-side state only: the supervisor and the HTTP client are Qt-free and are called from workers;
their callbacks arrive here on other threads and are re-emitted as signals (queued to the GUI).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer, Signal

from app.client import EngineClient
from app.settings import Settings
from app.supervisor import EngineSupervisor, SupervisorState
from ui.engine_actions import EngineActions
from ui.gui_thread import gui_calls
from ui.resident_models import chatting_model
from ui.status_poll import IDLE_POLL_FACTOR, POLL_INTERVAL_MS, WAKE_S, engine_idle, timed_status
from ui.workers import FunctionWorker

log = logging.getLogger(__name__)

REMOTE = "remote"  # the controller's state while a remote server is used (no supervisor state)


class EngineController(QObject):
    """Owns the engine's lifecycle for the GUI and polls `/v1/engine/status` without blocking.

    `state` is the supervisor's (a SupervisorState) or REMOTE.
    """

    state_changed = Signal(str)
    status_changed = Signal(dict)  # the last /v1/engine/status body (or {"status": "unreachable"})
    models_changed = Signal(list)  # model ids the engine serves
    message = Signal(str)  # a line for the user (errors from start/stop/load)
    load_finished = Signal(str, str)  # (model id, "" when it loaded, else what failed in words)
    unload_finished = Signal(str, str)  # (model id, "" when it unloaded, else what failed in words)
    show_window_requested = Signal()
    quit_requested = Signal()
    _supervisor_state = Signal(str)  # from the supervisor's watcher thread

    def __init__(self, settings: Settings, supervisor: EngineSupervisor | None = None, parent: QObject | None = None,
                 poll_interval_ms: int = POLL_INTERVAL_MS) -> None:
        super().__init__(parent)
        self.settings = settings
        self.supervisor = supervisor
        self.last_status: dict = {}
        self.quitting = False  # Quit was asked for (menu, tray, signal)
        self.models: list[str] = []
        self.model_names: dict[str, str] = {}  # id -> the name /v1/models gives (Ember's: the store's)
        self.chat_model: str | None = None  # the model of the chat in view (None: it has none of its own)
        self._client: EngineClient | None = None
        self._client_key: tuple | None = None
        self._poll_worker: FunctionWorker | None = None
        self._models_worker: FunctionWorker | None = None
        self._models_again = False  # a refresh was asked for while one was in flight
        self._closed = False  # close() ran: late worker results are dropped
        self._state: str = REMOTE if self.is_remote else SupervisorState.STOPPED
        self._supervisor_state.connect(self._on_supervisor_state)
        self._unsubscribe: Callable[[], None] | None = None
        if supervisor is not None:
            gui = gui_calls()  # the watcher thread must not emit itself: see ui/gui_thread.py
            self._unsubscribe = supervisor.on_state_change(lambda state: gui.call(self._supervisor_state.emit, state))
            self._state = supervisor.state
        self._poll_ms = poll_interval_ms
        self._awake_until = 0.0  # monotonic time until which the poll stays on the short interval
        self._poll_timer = QTimer(self)
        self._poll_timer.setInterval(poll_interval_ms)
        self._poll_timer.timeout.connect(self.poll)
        self._held: set[int] = set()  # what keeps the poll on the short interval (a reply waiting for memory)
        self.actions = EngineActions(self.client, self)  # load, unload, stop, restart: in workers
        for mine, theirs in ((self.actions.load_finished, self.load_finished), (self.actions.done, self.poll),
                             (self.actions.unload_finished, self.unload_finished), (self.actions.message, self.message)):
            mine.connect(theirs)

    # ---- read-only state (the tray and status bar build from these) ----
    @property
    def is_remote(self) -> bool:
        return bool(self.settings.connection_url)

    @property
    def state(self) -> str:
        return self._state

    @property
    def poll_interval_ms(self) -> int:
        """The status poll's current interval: the configured one, or IDLE_POLL_FACTOR times it."""
        return self._poll_timer.interval()

    @property
    def base_url(self) -> str | None:
        if self.is_remote:
            return self.settings.connection_url
        return self.supervisor.base_url if self.supervisor is not None else None

    @property
    def api_key(self) -> str | None:
        if self.is_remote:
            return self.settings.connection_key
        if self.supervisor is not None and self.supervisor.api_key:
            return self.supervisor.api_key
        return self.settings.api_key

    @property
    def serving_model(self) -> str | None:
        """The model a chat without one of its own talks to: the engine's most recently used that chats
        (an embedding model that indexed documents since is not one)."""
        return chatting_model(self.last_status) or (self.models[0] if self.models else None) or self.settings.default_model

    @property
    def current_model(self) -> str | None:
        """The model of the chat in view (each chat has its own), else the engine's most recent."""
        return self.chat_model or self.serving_model

    def client(self) -> EngineClient | None:
        """A client for the current address (the supervisor may pick a new port on restart)."""
        url = self.base_url
        if not url:
            return None
        key = (url, self.api_key)
        if key != self._client_key:
            self._client, self._client_key = EngineClient(url, api_key=self.api_key), key
        return self._client

    # ---- actions ----
    def start(self) -> None:
        """Start polling and, for the local engine, the engine process (in a worker)."""
        self._closed = False
        self._poll_timer.start()
        if self.is_remote:
            self._set_state(REMOTE)
            self.poll()
            self.refresh_models()
        elif self.supervisor is not None:
            self.start_server()

    def start_server(self) -> None:
        if self.supervisor is None or self.is_remote:
            return
        self.supervisor.start()  # non-blocking: the supervisor's watcher thread spawns and follows the engine

    def stop_server(self) -> None:
        if self.supervisor is None or self.is_remote:
            return
        self.actions.engine(self.supervisor.stop)

    def restart_server(self) -> None:
        if self.supervisor is not None and not self.is_remote:
            self.actions.engine(self.supervisor.restart)

    def apply_connection(self) -> None:
        """After the connection settings changed: switch between the local engine and a remote server."""
        self.models, self.last_status = [], {}
        self.models_changed.emit([])
        if self.is_remote:
            if self.supervisor is not None and self.supervisor.state is not SupervisorState.STOPPED:
                self.actions.engine(self.supervisor.stop)
            self._set_state(REMOTE)
            self.poll()
            self.refresh_models()
        else:
            self._set_state(self.supervisor.state if self.supervisor is not None else SupervisorState.STOPPED)
            self.start_server()

    def load_model(self, model_id: str) -> None:
        """Load beside the loaded models, in a worker; `load_finished` says how it ended."""
        self.actions.load(model_id)

    def unload_model(self, model_id: str | None = None) -> None:
        """Unload one model (None: all), in a worker; `unload_finished` says how it ended."""
        self.actions.unload(model_id)

    def close(self) -> None:
        """Stop polling and listening to the supervisor; the engine itself keeps running. A poll
        already answered but not yet delivered is dropped: the window may be gone by then."""
        self._closed = True
        self._poll_timer.stop()
        for w in (self._poll_worker, self._models_worker):
            if w is not None:
                w.quit()
        self.actions.quit()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def shutdown(self) -> None:
        """close() and stop the engine; blocking, called once on quit."""
        self.close()
        if self.supervisor is not None:
            try:
                self.supervisor.stop()
            except Exception:  # quitting anyway
                log.exception("stopping the engine failed")

    def request_show_window(self) -> None:
        self.show_window_requested.emit()

    def request_quit(self) -> None:
        self.quitting = True  # the window's close then quits instead of keeping Ember in the tray
        self.quit_requested.emit()

    def poll(self) -> None:
        """One status request in a worker; skipped while the previous one is in flight."""
        client = self.client()
        if client is None or (self._poll_worker is not None and not self._poll_worker.is_finished):
            return
        self._poll_worker = FunctionWorker(timed_status, client)
        self._poll_worker.returned.connect(self._on_status)
        self._poll_worker.errored.connect(self._on_status_error)
        self._poll_worker.start()

    def wake(self) -> None:
        """Something is about to happen (a chat sends): poll now and on the short interval again."""
        self._awake_until = time.monotonic() + WAKE_S
        self._poll_timer.setInterval(self._poll_ms)
        self.poll()

    def keep_polling(self, holder: object, on: bool) -> None:
        """While `holder` waits (a reply waiting for memory), the poll stays on the short interval."""
        if on:
            self._held.add(id(holder))
            self._poll_timer.setInterval(self._poll_ms)
        else:
            self._held.discard(id(holder))

    def refresh_models(self) -> None:
        """Ask the engine for its models. While an answer is in flight it may predate what made
        this call (a model imported a moment ago), so one more request follows it."""
        client = self.client()
        if client is None:
            return
        if self._models_worker is not None and not self._models_worker.is_finished:
            self._models_again = True
            return
        self._models_again = False
        self._models_worker = FunctionWorker(client.models)
        self._models_worker.returned.connect(self._on_models)
        self._models_worker.finished.connect(self._on_models_finished)
        self._models_worker.start()

    def _on_models_finished(self) -> None:
        if self._models_again and not self._closed:
            self.refresh_models()

    # ---- slots ----
    def _on_supervisor_state(self, state: str) -> None:
        if self.is_remote:  # the local engine stopping is not news while a remote server is used
            return
        self._set_state(state)
        if state == SupervisorState.READY:
            self.poll()
            self.refresh_models()

    def _set_state(self, state: str) -> None:
        if state != self._state:
            self._state = state
            self.state_changed.emit(state)

    def _on_status(self, status: dict) -> None:
        if self._closed:
            return
        self.last_status = dict(status)
        idle = engine_idle(status) and not self._held and time.monotonic() >= self._awake_until
        interval = self._poll_ms * (IDLE_POLL_FACTOR if idle else 1)
        if interval != self._poll_timer.interval():
            self._poll_timer.setInterval(interval)
        if self.supervisor is not None and not self.is_remote:
            self._set_state(self.supervisor.state)
        if not self.models and status.get("status") == "ready":
            self.refresh_models()
        self.status_changed.emit(self.last_status)

    def _on_status_error(self, error: Exception) -> None:
        if self._closed:
            return
        self.last_status = {"status": "unreachable", "message": str(error)}
        self.status_changed.emit(self.last_status)

    def _on_models(self, models: list[dict]) -> None:
        if self._closed:
            return
        ids = [m["id"] for m in models]  # client.models() keeps only entries with an id
        names = {m["id"]: m["name"] for m in models if isinstance(m.get("name"), str) and m["name"]}
        if ids != self.models or names != self.model_names:
            self.models, self.model_names = ids, names
            self.models_changed.emit(ids)

