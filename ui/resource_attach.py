"""Attach an MCP resource to the message being written: a menu of the chat's servers' resources under
the message box; the chosen one is read on a worker and put into the box as a fenced block naming its
URI, where the user sees (and may trim) exactly what the model will read."""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QMenu, QPlainTextEdit, QToolButton, QWidget

from app.agent.chat_tools import ChatTools
from app.agent.mcp_connection import ResourceInfo, ServerStatus
from app.agent.prompt_commands import with_resource
from ui.workers import FunctionWorker


class ResourceButton(QToolButton):
    """"Attach" with its menu (shown when the app has MCP tools at all)."""

    def __init__(self, tools: ChatTools, chat_settings: Callable[[], dict], box: QPlainTextEdit,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tools, self._settings, self.box = tools, chat_settings, box
        self.setText("Attach")
        self.setToolTip("Attach a resource of the chat's MCP servers to the message")
        self.setPopupMode(QToolButton.InstantPopup)
        self.menu_ = QMenu(self)
        self.setMenu(self.menu_)
        self.menu_.aboutToShow.connect(self._fill)
        self._workers: list[FunctionWorker] = []
        self.message = ""  # what the last attempt said went wrong ("" when all went well)

    def _fill(self) -> None:
        self.menu_.clear()
        settings = self._settings()
        resources = self.tools.resources_for(settings)
        for r in resources:
            action = self.menu_.addAction(f"{r.name}  ({r.server}: {r.uri})")
            action.triggered.connect(lambda _=False, r=r: self.attach(r))
        states = self.tools.states()
        on = self.tools.enabled_for(settings)
        idle = [n for n in on if n not in states or states[n].status in (ServerStatus.STOPPED, ServerStatus.STARTING)]
        if not on:
            self.menu_.addAction("Turn on an MCP server for this chat (chat settings, Tools)").setEnabled(False)
        elif idle:  # the chat's servers start when it first needs them: this is such a time
            self.menu_.addAction("Starting the chat's servers…").setEnabled(False)
            self._run(self.tools.host.start, idle, then=lambda _states: self._refill())
        elif not resources:
            self.menu_.addAction("The chat's servers offer no resources").setEnabled(False)

    def _refill(self) -> None:
        if self.menu_.isVisible():
            self._fill()

    def attach(self, resource: ResourceInfo) -> None:
        """Read the resource (a worker) and put it into the message box below what is written."""
        self._run(self.tools.host.read_resource, resource.server, resource.uri,
                  then=lambda text: self._insert(resource.uri, text))

    def _insert(self, uri: str, text: str) -> None:
        self.box.setPlainText(with_resource(self.box.toPlainText().rstrip(), uri, text))
        self.box.setFocus()

    def _run(self, func, *args, then) -> None:
        worker = FunctionWorker(func, *args)
        worker.returned.connect(then)
        worker.errored.connect(self._failed)
        worker.finished.connect(lambda: self._workers.remove(worker) if worker in self._workers else None)
        self._workers.append(worker)
        worker.start()

    def _failed(self, exc: Exception) -> None:
        self.message = f"Could not read the resource: {exc}"
        self.setToolTip(self.message)
