"""A chat's documents: files attached to it (the attach button, or dropped on the chat) go into the
chat's own collection, made on the first attach and named after the chat; the chat may also use named
collections (chosen in its settings panel). While it has any, its requests send `documents` and each
reply's sources come back with it. A line above the message box says how its files are indexing.

All network work runs on workers (ui/workers.py); this object only reacts to their signals."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtWidgets import QFileDialog, QLabel, QToolButton, QWidget

from app.client import EngineClient
from app.doc_sync import CHAT_KEY, IndexClock, add_files, status_words
from app.embedders import embedder_problem
from ui.resident_models import resident
from ui.resources import icon
from ui.source_dialog import SourceDialog
from ui.workers import FunctionWorker, GeneratorWorker, WorkerSet

OWN_KEY, COLLECTIONS_KEY = "documents_store", "documents_collections"  # the chat's settings
POLL_MS = 1000
RED = "#c92a2a"


def dropped_files(event) -> list[Path]:
    mime = event.mimeData()
    return [Path(u.toLocalFile()) for u in mime.urls() if u.isLocalFile() and Path(u.toLocalFile()).is_file()] \
        if mime.hasUrls() else []


def attach_job(client: EngineClient, store_id: str | None, name: str, chat_id: int, paths: list[Path]):
    """Make the chat's collection when it has none (yields ("store", id)), then add each file
    (yields ("file", path, error or ""))."""
    if store_id is None:
        store_id = client.create_vector_store(name, {CHAT_KEY: str(chat_id)})["id"]
        yield "store", store_id
    for path, error in add_files(client, store_id, paths):
        yield "file", path, error


class ChatDocuments(QObject):
    def __init__(self, view: QWidget) -> None:
        super().__init__(view)
        self.view = view
        self.workers = WorkerSet()
        self._clock = IndexClock()
        self._files: list[dict] = []
        self._problem = ""
        self.dialog: SourceDialog | None = None  # the passage shown last
        self.line = QLabel(view, textFormat=Qt.PlainText, wordWrap=True, objectName="chatDocuments")
        self.line.hide()
        view.layout().insertWidget(1, self.line)
        self.button = QToolButton(view, icon=icon("attach-file"), objectName="addFilesButton")
        self.button.setToolTip("Add files: give this chat files to answer from (PDF, Word, PowerPoint, HTML, "
                               "Markdown, text, code); you can also drop them on the chat")
        self.button.setAccessibleName("Add files")
        self.button.setFocusPolicy(Qt.TabFocus)
        self.button.clicked.connect(self.choose_files)
        view.buttons_row.insertWidget(1, self.button)
        self._poll = QTimer(self, singleShot=True, interval=POLL_MS)
        self._poll.timeout.connect(self.refresh)
        for w in (view.input, view.transcript.viewport()):
            w.setAcceptDrops(True)
            w.installEventFilter(self)
        view.actions.source_requested.connect(self.show_source)
        view.title_changed.connect(self._on_title_changed)
        self.refresh()

    # ---- what the chat sends ----
    def settings(self) -> dict:
        return self.view.chat_store.get_chat(self.view.chat_id).settings

    def store_ids(self) -> list[str]:
        s = self.settings()
        return list(dict.fromkeys(([s[OWN_KEY]] if s.get(OWN_KEY) else []) + list(s.get(COLLECTIONS_KEY) or [])))

    def request_field(self) -> dict | None:
        """The request's `documents` (None: the chat has no documents)."""
        ids = self.store_ids()
        return {"vector_store_ids": ids} if ids else None

    def default_model(self) -> str | None:
        """The model a chat without its own talks to, named when the engine's most recently used model
        is the embedder (it indexed or searched last): the engine would otherwise pick it for the
        chat. None (the engine's choice) otherwise."""
        models = resident(self.view.engine.last_status)
        return self.view.engine.serving_model if models and models[0].get("embeds_only") else None

    def ready_to_send(self) -> bool:
        """False (and the reason shown above the message box) when the chat's documents cannot be searched."""
        problem = None
        if self.store_ids() and not self.view.engine.is_remote:
            problem = embedder_problem(self.view.engine.settings)
        self._problem = problem or ""
        self._show()
        return problem is None

    # ---- attaching ----
    def choose_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self.view, "Files for this chat")
        if paths:
            self.attach([Path(p) for p in paths])

    def attach(self, paths: list[Path]) -> None:
        client = self.view.engine.client()
        if client is None:
            self._problem = "The engine is not running: start it (Engine menu), then add the files again."
            self._show()
            return
        chat = self.view.chat_store.get_chat(self.view.chat_id)
        self._problem = ""
        self.line.setText(f"Adding {len(paths)} file{'s' if len(paths) > 1 else ''}…")
        self.line.show()
        self.workers.run(GeneratorWorker(attach_job, client, chat.settings.get(OWN_KEY), f"Chat: {chat.title}",
                                  chat.id, paths), yielded=self._on_attached, finished=self.refresh)

    def _on_attached(self, event: tuple) -> None:
        if event[0] == "store":
            self.view.chat_store.update_chat_settings(self.view.chat_id, {OWN_KEY: event[1]})
        elif event[2]:
            self._problem = f"{Path(event[1]).name}: {event[2]}"
            self._show()

    def _on_title_changed(self, _chat_id: int, title: str) -> None:
        """The chat's own collection keeps the chat's name (it was made under its first title)."""
        own, client = self.settings().get(OWN_KEY), self.view.engine.client()
        if own and client is not None:
            self.workers.run(FunctionWorker(client.rename_vector_store, own, f"Chat: {title}"))

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt name
        if event.type() in (QEvent.DragEnter, QEvent.DragMove) and dropped_files(event):
            event.acceptProposedAction()
            return True
        if event.type() == QEvent.Drop and (paths := dropped_files(event)):
            event.acceptProposedAction()
            self.attach(paths)
            return True
        return False

    # ---- the files' state ----
    def refresh(self) -> None:
        """List the chat's own files (a worker); poll again while any is indexing."""
        own, client = self.settings().get(OWN_KEY), self.view.engine.client()
        if own is None or client is None:
            self._show()
            return
        self.workers.run(FunctionWorker(client.vector_store_files, own), returned=self._on_files,
                         errored=self._on_files_error)

    def _on_files_error(self, error: Exception) -> None:
        """The chat's collection was deleted (in the Documents view): the chat has no files now."""
        if getattr(error, "status_code", None) == 404:
            self.view.chat_store.update_chat_settings(self.view.chat_id, {OWN_KEY: None})
            self._files = []
            self._show()

    def _on_files(self, files: list[dict]) -> None:
        self._files = files
        self._show()
        if any(f.get("status") == "in_progress" for f in files):
            self._poll.start()

    def _show(self) -> None:
        names = {}
        for f in self._files:
            progress = f.get("progress") or {}
            left = self._clock.seconds_left(f["id"], progress.get("chunks_done", 0), progress.get("chunks_total", 0)) \
                if f.get("status") == "in_progress" else None
            name = Path(str((f.get("attributes") or {}).get("path") or f["id"])).name
            names[name] = status_words(f, left)
        text = " · ".join(f"{n}: {w}" for n, w in names.items())
        if self._problem:
            text = self._problem
        self.line.setStyleSheet(f"color: {RED}" if self._problem else "")
        self.line.setText(text)
        self.line.setVisible(bool(text))

    def show_source(self, index: int, number: int) -> SourceDialog | None:
        msgs = self.view.transcript.messages
        source = next((s for s in msgs[index].sources if s.index == number), None) if 0 <= index < len(msgs) else None
        if source is None:
            return None
        dialog = SourceDialog(source, self.view.engine.client(), self.view)
        dialog.setAttribute(Qt.WA_DeleteOnClose)
        dialog.open()
        self.dialog = dialog
        return dialog
