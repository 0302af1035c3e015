"""The part of a chat view that runs a turn with the chat's MCP tools: it makes the AgentReply when the
chat has servers on, answers the loop's approval questions on the GUI thread, and shows the loop's
events in the reply (its calls as they start and end, a server that failed, the step limit).

The approval crosses threads: the loop's thread posts the question here (ui/gui_thread.py, never a
signal off the GUI thread), the approver (a modal dialog) answers on the GUI thread, and the answer
goes back through a Future the loop's thread waits on; a Stop answers it DENY (ui/agent_reply.py).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from app.agent.chat_tools import ChatTools
from app.agent.loop import ReplyStarted, StepEvent, StepLimitReached
from app.agent.mcp_connection import ToolInfo
from app.agent.steps import Approval, CallStatus, ToolStep
from ui.agent_reply import AgentReply, CommandRefused, PromptExpanded, ServerFailed, answer
from ui.gui_thread import gui_calls
from ui.resident_models import entry
from ui.transcript_message import TranscriptMessage

log = logging.getLogger(__name__)

Approver = Callable[[ToolStep, ToolInfo], Approval]
STOPPED_RESULT = "error: the user stopped the reply"
ASKING = "asking"  # in a step's `extra` while the user is asked to approve it


def context_tokens(status: dict, model: str | None) -> int | None:
    """The context of the model that will answer, as the engine's status gives it (None: unknown)."""
    found = entry(status, model) or {}
    return found.get("context_length") or status.get("max_model_len") or None


def close_steps(reply: TranscriptMessage) -> None:
    """A call still running (or waiting for its approval) when the reply ends was cancelled with it."""
    for step in reply.steps:
        step.extra.pop(ASKING, None)
        if step.status is CallStatus.RUNNING:
            step.status, step.result = CallStatus.CANCELLED, step.result or STOPPED_RESULT


class AgentTurn:
    def __init__(self, view: Any, tools: ChatTools | None, approver: Approver | None) -> None:
        self.view, self.tools, self._approver = view, tools, approver
        self._gui = gui_calls()  # made here, on the GUI thread
        self._told: set[ServerFailed] = set()  # a failed server stays failed until retried: said once

    def stream(self, client: Any, history: list[dict], model: str | None, sampling: dict,
               chat_settings: dict) -> AgentReply | None:
        """The turn as an agent run, when the chat has servers on; None: a plain reply."""
        if self.tools is None or not self.tools.enabled_for(chat_settings):
            return None
        engine = self.view.engine
        return AgentReply(client, history, self.tools, chat_settings, self._post_question,
                          ChatTools.agent_config(engine.settings), model=model,
                          context_tokens=context_tokens(engine.last_status, model or engine.serving_model),
                          **sampling)

    # ---- approval ----
    def _post_question(self, step: ToolStep, tool: ToolInfo, question: Future) -> None:  # the loop's thread
        self._gui.post(self._ask, step, tool, question)

    def _ask(self, step: ToolStep, tool: ToolInfo, question: Future) -> None:
        if question.done():  # stopped before the question came up
            return
        if self.view._reply is not None:  # the call shows while the user decides
            self.view._reply.pending = ""  # the reply has begun: its call, not "Reading the chat…"
            step.extra[ASKING] = True
            self._show_step(self.view._reply, step)
            self.view.transcript.render_now()
        try:
            choice = self._approve(step, tool)
        except Exception:  # noqa: BLE001 - a failed dialog must not leave the loop waiting
            log.exception("asking to approve %s failed", step.name)
            choice = Approval.DENY
        if choice is Approval.ALWAYS and self.tools is not None and not question.done():
            self.tools.allow_always(tool.server, tool.name)
        answer(question, choice)

    def _approve(self, step: ToolStep, tool: ToolInfo) -> Approval:
        if self._approver is None:
            from ui.tool_approval import ask_approval  # the dialog (its own module)
            return ask_approval(self.view, step, tool)
        return self._approver(step, tool)

    # ---- the loop's events, on the GUI thread ----
    def handle(self, event: Any) -> None:
        view, reply = self.view, self.view._reply
        if reply is None:
            return
        if isinstance(event, ReplyStarted):
            if event.round > 0:
                view.next_round(event.t_sent)
            return
        if isinstance(event, PromptExpanded):  # the `/name …` line is now the prompt's text
            asked = next((m for m in reversed(view.transcript.messages) if m.role == "user"), None)
            if asked is not None:
                asked.content = event.text
                if asked.msg_id is not None:
                    view.chat_store.update_message(asked.msg_id, content=event.text)
            view.transcript.schedule_render()
            return
        if isinstance(event, CommandRefused):
            reply.notices.append(event.reason)
        elif isinstance(event, ServerFailed):
            if event in self._told:
                return
            self._told.add(event)
            reply.notices.append(f"The MCP server {event.server!r} is unavailable: {event.reason}. "
                                 "The chat goes on without its tools.")
        elif isinstance(event, StepLimitReached):
            reply.notices.append(f"The tool step limit ({event.limit}) is reached: the model is asked to answer "
                                 "without tools.")
        elif isinstance(event, StepEvent):
            self._show_step(reply, event.step)
        view.chat_store.update_message(view._reply_id, tool_steps=reply.steps, notices=reply.notices)  # a crash
        view.transcript.schedule_render()  # loses no call that ran

    @staticmethod
    def _show_step(reply: TranscriptMessage, step: ToolStep) -> None:
        for n, known in enumerate(reply.steps):
            if known.call_id == step.call_id:
                reply.steps[n] = step
                return
        reply.steps.append(step)
