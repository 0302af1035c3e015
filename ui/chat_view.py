"""One open chat: its transcript, the input box, Send/Stop/Regenerate, and its own stream worker.

Every chat has its own worker, so several chats stream at once (the engine batches them). The
worker runs a Qt-free generator, `ReplyStream` or, when the chat has MCP servers on, `AgentReply`
(ui/agent_turn.py: a reply that called tools is a message of its own); this view reacts to signals.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QVBoxLayout, QWidget

from app.agent.chat_tools import ChatTools
from app.client import ChatDelta
from app.history import ChatStore
from app.reply_versions import ReplyVersions
from app.sampling_defaults import effective_settings, request_fields
from ui.agent_turn import AgentTurn, Approver, close_steps
from ui.chat_buttons import add_buttons, keep_typing_focus, put_back
from ui.chat_documents import ChatDocuments
from ui.chat_images import ChatImages
from ui.engine_controller import EngineController
from ui.error_words import reply_error_text
from ui.message_actions import MessageActions, keep_versions
from ui.message_input import MessageInput
from ui.pending_reply import PendingReply
from ui.reply_clock import ReplyClock
from ui.reply_stream import ReplyStream
from ui.transcript import TranscriptView
from ui.transcript_message import TranscriptMessage, api_messages, from_history
from ui.workers import GeneratorWorker

log = logging.getLogger(__name__)

PERSIST_INTERVAL_S = 1.0  # partial replies reach SQLite this often, so a crash loses little
DEFAULT_TITLE = "New chat"


class ChatView(QWidget):
    """The open chat. `reply_stats` reports TTFT and tok/s of the reply in flight."""

    reply_started = Signal(int)
    reply_finished = Signal(int, str)  # chat id, final status: done | stopped | error
    reply_stats = Signal(dict)  # {"chat_id", "ttft_s", "tok_s", "tokens"}
    reply_usage = Signal(int, object)  # chat id, the reply's Usage (app/openai_stream.py) once the server sends it
    title_changed = Signal(int, str)

    def __init__(self, chat_store: ChatStore, chat_id: int, engine: EngineController,
                 model_defaults: Callable[[str | None], dict] | None = None,
                 versions: ReplyVersions | None = None, parent: QWidget | None = None,
                 tools: ChatTools | None = None, approver: Approver | None = None) -> None:
        super().__init__(parent)
        self.agent = AgentTurn(self, tools, approver)  # None approver: the dialog of ui/tool_approval.py
        self.versions = versions  # the replies Regenerate wrote, kept across restarts (None: this session only)
        self.chat_store, self.chat_id, self.engine = chat_store, chat_id, engine
        self._model_defaults = model_defaults or (lambda _model: {})
        self._worker: GeneratorWorker | None = None
        self._stream: ReplyStream | None = None  # or an AgentReply (ui/agent_reply.py), which quacks alike
        self._reply: TranscriptMessage | None = None
        self._reply_id: int | None = None
        self._clock = ReplyClock()
        self._stream_model: str | None = None  # the model asked for, until the server names the one that wrote
        self._last_persist = 0.0
        self._stats: dict | None = None
        self._pending = PendingReply(engine, self)  # "Waiting for memory: 1 ahead" until the reply begins

        self.transcript = TranscriptView(self)
        self.input = MessageInput(self)
        buttons = add_buttons(self)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.transcript, 1)
        layout.addWidget(self.input)
        layout.addLayout(buttons)

        self.input.submitted.connect(self.send)
        self.send_button.clicked.connect(lambda: self.send(self.input.toPlainText()))
        self.stop_button.clicked.connect(self.stop)
        self.regenerate_button.clicked.connect(self.regenerate)
        self.actions = MessageActions(self.transcript, chat_store, versions, lambda: self.is_streaming, self.stop,
                                      parent=self)
        self.transcript.action_requested.connect(self.actions.run)
        self.actions.edit_requested.connect(lambda text, _images: put_back(self, text))  # images: ui/chat_images.py
        self.actions.continue_requested.connect(self.continue_reply)
        self.docs = ChatDocuments(self)  # its files and collections: `documents` in its requests, sources back
        self.images = ChatImages(self)  # the pictures of the message being written, kept with it once sent
        self._load()

    # ---- public API (tests drive these, as a user would through the buttons) ----
    @property
    def is_streaming(self) -> bool:
        return self._worker is not None

    def send(self, text: str) -> None:
        text = text.strip()
        if not (text or self.images.pending) or self.is_streaming or not self.docs.ready_to_send() \
                or not self.images.ready_to_send():
            return
        self.input.clear()
        images = self.images.take()
        msg_id = self.chat_store.add_message(self.chat_id, "user", text, images=images)
        self.transcript.messages.append(TranscriptMessage("user", text, msg_id=msg_id, images=images))
        self._maybe_title_from(text or "Image")
        self._start_reply(new_message=True)

    def stop(self) -> None:
        """Stop the reply in flight: the worker closes the stream (aborting the request) at once."""
        if self._worker is None:
            return
        self._worker.quit()
        self._stream.cancel()
        self._finish("stopped")

    def regenerate(self) -> None:
        """Replace the last assistant reply with a new one."""
        if self.is_streaming:
            self.stop()
        msgs = self.transcript.messages
        if not msgs or msgs[-1].role != "assistant" or msgs[-1].msg_id is None:
            return
        self._reply_id = msgs[-1].msg_id
        earlier = msgs.pop()
        self._start_reply(new_message=False)
        self._reply.versions = [v for v in earlier.versions or [earlier.content] if v]  # kept to flip back to
        self.input.setFocus()

    def effective_settings(self) -> dict:
        """What this chat sends (and the settings panel shows): its settings over the model's and Ember's."""
        chat = self.chat_store.get_chat(self.chat_id)
        return effective_settings(chat.settings, self._model_defaults(chat.model or self.engine.serving_model))

    # ---- the reply ----
    def continue_reply(self, index: int) -> None:
        """Let the last reply, which thought through its budget, go on with another Max tokens to spend."""
        msgs = self.transcript.messages
        if not self.is_streaming and index == len(msgs) - 1 and msgs[index].out_of_budget:
            self._reply_id = msgs[index].msg_id
            self._start_reply(new_message=False, continuing=msgs[index])

    def _start_reply(self, new_message: bool, continuing: TranscriptMessage | None = None) -> None:
        settings = self.effective_settings()
        system, sampling = request_fields(settings)
        if settings.get("speculative") is False and (not self.engine.is_remote
                                                     or "speculative" in self.engine.last_status):
            sampling["speculative"] = "off"  # this chat opted out (other servers may not know the field)
        history = api_messages(self.transcript.messages, system, self.images.image_uri())
        sampling["documents"] = self.docs.request_field()
        if continuing is None:
            self._reply = TranscriptMessage("assistant", "", "streaming")
            self.transcript.messages.append(self._reply)
        else:  # the server goes on from its thoughts (and answer) so far
            history.append({"role": "assistant", "content": continuing.content,
                            "reasoning_content": continuing.reasoning})
            sampling["continue_final_message"] = True
            self._reply, continuing.status, continuing.thought_s = continuing, "streaming", None
        if new_message:
            self._reply_id = self.chat_store.add_message(self.chat_id, "assistant", "", status="streaming")
        else:
            self.chat_store.update_message(self._reply_id, self._reply.content, "streaming")
        self._reply.msg_id = self._reply_id
        self._clock, self._stats = ReplyClock(), None
        self._last_persist = self._clock.t_sent
        client = self.engine.client()
        if client is None:
            self.transcript.render_now()
            self._finish("error", "The engine is not running. Start it from the Engine menu or the tray.")
            return
        chat = self.chat_store.get_chat(self.chat_id)
        model = chat.model or self.docs.default_model()  # its own (loaded just in time); None: the server's
        agent = self.agent.stream(client, history, model, sampling, chat.settings) if continuing is None else None
        self._stream = agent or ReplyStream(client, history, model=model, **sampling)
        self._stream_model = model or self.engine.last_status.get("model")  # until the server names it
        self._pending.watch(self._reply, self._stream_model, self.transcript.schedule_render)
        self._worker = GeneratorWorker(self._stream.run)
        self._worker.yielded.connect(self._on_delta)
        self._worker.errored.connect(self._on_error)
        self._worker.returned.connect(self._on_returned)
        self._worker.finished.connect(self._on_worker_finished)
        self.update_buttons()
        self.transcript.render_now()
        self.reply_started.emit(self.chat_id)
        self._worker.start()

    def _is_current(self) -> bool:
        """Signals from a worker this view has already let go of (stopped, replaced) are ignored."""
        return self._worker is not None and self.sender() is self._worker.signals

    def _on_delta(self, delta: ChatDelta) -> None:
        if not self._is_current() or self._reply is None:
            return
        if not isinstance(delta, ChatDelta):  # an agent's event: a call, a new reply, a notice
            self.agent.handle(delta)
            return
        text = delta.text
        now = time.monotonic()
        if delta.reasoning:  # thinking streams into its own block, timed until the answer starts
            self._clock.token(now)
            self._reply.reasoning += delta.reasoning
        if text:
            self._clock.token(now)
            if self._reply.reasoning and self._reply.thought_s is None:
                self._reply.thought_s = now - self._clock.t_first
            self._reply.content += text
        if delta.usage:
            self._clock.tokens = delta.usage.completion_tokens or self._clock.tokens
            self.reply_usage.emit(self.chat_id, delta.usage)
        if delta.finish_reason:
            self._reply.finish_reason = delta.finish_reason
        self._reply.sources = list(delta.sources) or self._reply.sources
        if delta.tool_calls:  # the server's parsed calls, as data: the reply's text holds none of their syntax
            self._reply.tool_calls = [(c.name, c.arguments) for c in delta.tool_calls]
        self._emit_stats(delta.tok_s)
        self.transcript.schedule_render()
        if now - self._last_persist >= PERSIST_INTERVAL_S:
            self._last_persist = now
            self.chat_store.update_message(self._reply_id, self._reply.content, "streaming",
                                           reasoning=self._reply.reasoning or None)

    def _on_returned(self, _value: object) -> None:
        if self._is_current():
            self._finish("done")

    def _on_error(self, error: Exception) -> None:
        if not self._is_current():
            return
        log.info("reply in chat %s failed: %s", self.chat_id, error)
        self._finish("error", reply_error_text(error, self.engine.is_remote))

    def _on_worker_finished(self) -> None:
        if self._is_current():  # ended without returning (aborted): treat as stopped
            self._finish("stopped")

    def _finish(self, status: str, error: str | None = None) -> None:
        reply, self._worker = self._reply, None
        self._pending.stop()
        if reply is not None:
            self._save_reply(reply, status, error)
        self._reply, self._stream = None, None
        self.transcript.model_names = self.engine.model_names
        self.transcript.render_now()
        focus = self.window().focusWidget()
        self.update_buttons()
        keep_typing_focus(self, focus)
        self.reply_finished.emit(self.chat_id, status)

    def _save_reply(self, reply: TranscriptMessage, status: str, error: str | None = None) -> None:
        reply.status, reply.error = status, error
        if reply.reasoning and reply.thought_s is None:  # it thought until the end (or was stopped)
            reply.thought_s = time.monotonic() - (self._clock.t_first or self._clock.t_sent)
        reply.add_version()
        keep_versions(self.versions, reply)
        close_steps(reply)
        stats = self._stats or {}
        reply.tok_s, reply.ttft = stats.get("tok_s") or None, stats.get("ttft_s")
        reply.model = (self._stream and self._stream.model) or self._stream_model
        self.chat_store.update_message(self._reply_id, reply.content, status, tok_s=reply.tok_s, ttft=reply.ttft,
                                       reasoning=reply.reasoning or None, thought_s=reply.thought_s,
                                       model=reply.model, finish_reason=reply.finish_reason,
                                       tool_calls=reply.tool_calls, tool_steps=reply.steps, notices=reply.notices,
                                       sources=reply.sources)

    def next_round(self, t_sent: float) -> None:
        """The reply that called tools is done; the next one, sent at `t_sent`, is a message of its own."""
        self._save_reply(self._reply, "done")
        self._reply_id = self.chat_store.add_message(self.chat_id, "assistant", "", status="streaming")
        self._reply = TranscriptMessage("assistant", "", "streaming", msg_id=self._reply_id)
        self.transcript.messages.append(self._reply)
        self._clock, self._stats = ReplyClock(t_sent), None

    def _emit_stats(self, server_tok_s: float | None) -> None:
        if (stats := self._clock.stats(server_tok_s)) is None:
            return
        stats["chat_id"] = self.chat_id
        self.info_label.setText(f"{stats['tokens']} tokens · {stats['tok_s']:.1f} tok/s · "
                                f"first token {stats['ttft_s'] * 1000:.0f} ms")
        self._stats = stats
        self.reply_stats.emit(stats)

    # ---- helpers ----
    def _load(self) -> None:
        self.transcript.model_names = self.engine.model_names
        self.transcript.set_messages(from_history(self.chat_store.messages(self.chat_id), self.versions))
        self.update_buttons()

    def _maybe_title_from(self, text: str) -> None:
        if (self.chat_store.get_chat(self.chat_id).title or DEFAULT_TITLE) == DEFAULT_TITLE:
            title = " ".join(text.split())[:48] or DEFAULT_TITLE
            self.chat_store.rename_chat(self.chat_id, title)
            self.title_changed.emit(self.chat_id, title)

    def update_buttons(self) -> None:
        streaming = self.is_streaming
        self.send_button.setEnabled(not streaming)
        self.stop_button.setEnabled(streaming)
        self.regenerate_button.setEnabled(not streaming and any(
            m.role == "assistant" for m in self.transcript.messages))

