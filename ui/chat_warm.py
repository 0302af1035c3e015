"""Warming the chat the user opens: the engine computes its prompt into the prefix cache in the
background (`POST /v1/engine/warm`, engine/server/warm.py), so the first reply after a restart
starts at once (its blocks read back from the disk tier, or computed while the user types).

Each chat is warmed once per engine start, when it is first shown (and the one in view when the
engine becomes ready): a chat first shown empty is not warmed later, since what it says from then
on that engine computes anyway. The engine runs a warm only while no reply needs it, so a warm never slows a chat.
Not warmed: a remote server's chats, a chat with nothing said yet or with a reply running, and a
chat with tools on whose MCP servers have not started yet (the tools' definitions are part of the
prompt, and known only once the servers run: after the app's restart, only the chat's first turn
starts them). A chat whose servers run already (another chat started them, or only the engine
restarted) is warmed with the tools its next turn will offer (`ChatTools.known_toolbox`).
The request is made by a FunctionWorker: the GUI thread never waits, and a failure is only logged.
"""
from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QStackedWidget

from app.sampling_defaults import request_fields
from app.supervisor import SupervisorState
from ui.engine_controller import EngineController
from ui.transcript_message import api_messages
from ui.workers import FunctionWorker

log = logging.getLogger(__name__)


class ChatWarmer(QObject):
    """Warms the chat `stack` shows (a ChatView) when it changes and when the engine is ready."""

    warmed = Signal(int, dict)  # chat id, the engine's answer: {"prompt_tokens", "cached_tokens", ...}

    def __init__(self, engine: EngineController, stack: QStackedWidget, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.engine, self.stack = engine, stack
        self._warmed: set[int] = set()  # chats warmed since the engine's last start
        self._workers: set[FunctionWorker] = set()  # kept until their signals have reached the GUI thread
        stack.currentChanged.connect(lambda _index: self.warm_current())
        engine.state_changed.connect(self._on_state_changed)

    def _on_state_changed(self, state: str) -> None:
        if state == SupervisorState.READY:
            self._warmed.clear()  # a new engine process: its RAM cache is empty
            self.warm_current()

    def warm_current(self) -> FunctionWorker | None:
        """Send the warm of the chat in view, if it is due (see the docstring); the worker, or None."""
        view = self.stack.currentWidget()
        if not hasattr(view, "chat_id") or view.chat_id in self._warmed:
            return None
        ready = self.engine.state == SupervisorState.READY and not self.engine.is_remote
        client = self.engine.client() if ready else None
        if client is None:
            return None
        if tools_pending(view):  # not marked: shown again once its servers run, it is warmed with their tools
            return None
        self._warmed.add(view.chat_id)  # shown to this engine: what the chat says from now on, it computes anyway
        request = warm_request(view)
        if request is None or view.is_streaming:
            return None
        messages, model, fields = request
        worker = FunctionWorker(client.warm, messages, model, **fields)
        chat_id = view.chat_id
        worker.returned.connect(lambda answer: self.warmed.emit(chat_id, answer))
        worker.errored.connect(lambda e: log.info("warming chat %s failed: %s", chat_id, e))
        worker.finished.connect(lambda: self._workers.discard(worker))
        self._workers.add(worker)
        worker.start()
        return worker


def tools_pending(view) -> bool:
    """The chat has tools on and a server of them has not started: what its next turn offers is unknown."""
    tools, settings = view.agent.tools, view.chat_store.get_chat(view.chat_id).settings
    return tools is not None and bool(tools.enabled_for(settings)) and tools.known_toolbox(settings) is None


def warm_request(view) -> tuple[list[dict], str | None, dict] | None:
    """(messages, model, other fields) the chat's next turn sends, but for its new message; None when
    there is nothing to warm or the prompt cannot be known here (tools on, their servers not started)."""
    chat = view.chat_store.get_chat(view.chat_id)
    tools, offered = view.agent.tools, {}
    if tools is not None and tools.enabled_for(chat.settings):
        toolbox = tools.known_toolbox(chat.settings)
        if toolbox is None:
            return None
        offered = {"tools": toolbox.openai_tools()} if toolbox else {}  # as app/agent/loop.py sends them
    system, sampling = request_fields(view.effective_settings())
    messages = api_messages(view.transcript.messages, system, view.images.image_uri())  # as ChatView sends
    if not any(m["role"] in ("user", "assistant") for m in messages):
        return None
    return messages, chat.model or view.docs.default_model(), sampling | offered
