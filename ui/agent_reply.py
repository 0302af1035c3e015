"""One chat turn with MCP tools as a plain, Qt-free generator that the GUI thread can cancel at once,
the counterpart of ReplyStream: it starts the chat's servers (blocking, so on the worker's thread),
says which of them failed, then runs the agent loop (app/agent/loop.py) and yields its events.

The loop asks for approval on its own thread: `ask(step, tool, answer)` hands the question on (the
chat view posts it to the GUI thread) and whoever answers sets `answer`, a Future. `cancel()` (the
user's Stop, from any thread) stops the loop and answers a pending question with DENY, so the loop's
thread never waits for a dialog nobody will answer.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, replace
from typing import Any

from app.agent.chat_tools import ChatTools
from app.agent.loop import AgentConfig, AgentRun, StepEvent
from app.agent.mcp_connection import ServerStatus, ToolInfo
from app.agent.prompt_commands import PromptCommandError, parse_command
from app.agent.steps import Approval, ToolStep

Ask = Callable[[ToolStep, ToolInfo, "Future[Approval]"], None]


@dataclass(frozen=True, slots=True)
class ServerFailed:
    """A server the chat has on did not start: the chat goes on without its tools."""

    server: str
    reason: str


@dataclass(frozen=True, slots=True)
class PromptExpanded:
    """The user's `/name …` line ran that MCP prompt: `text` replaces the line, stored and sent."""

    text: str


@dataclass(frozen=True, slots=True)
class CommandRefused:
    """A `/name …` line named a prompt but its arguments do not fit: nothing is sent; `reason` says how."""

    reason: str


def answer(future: Future, approval: Approval) -> None:
    """Answer a question unless it has been answered already (a Stop answers it with DENY)."""
    try:
        future.set_result(approval)
    except InvalidStateError:
        pass


class _StreamRecorder:
    """The engine client, keeping the last stream it opened: its `model` is the one that wrote."""

    def __init__(self, client: Any) -> None:
        self._client, self.stream = client, None

    def chat_stream(self, *args: Any, **kwargs: Any) -> Any:
        self.stream = self._client.chat_stream(*args, **kwargs)
        return self.stream


class AgentReply:
    def __init__(self, client: Any, messages: list[dict], tools: ChatTools, chat_settings: dict, ask: Ask,
                 config: AgentConfig, model: str | None = None, context_tokens: int | None = None,
                 **sampling: Any) -> None:
        self._client = _StreamRecorder(client)
        self._messages, self._tools, self._settings, self._ask = messages, tools, chat_settings, ask
        self._config, self._model, self._context, self._sampling = config, model, context_tokens, sampling
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._run: AgentRun | None = None
        self._question: Future | None = None

    def run(self) -> Iterator[Any]:
        if self._cancelled.is_set():
            return
        toolbox, states = self._tools.toolbox_for(self._settings)
        for name, state in states.items():
            if state.status is ServerStatus.FAILED:
                yield ServerFailed(name, state.error or "it did not start")
        expanded = self._expand_command()
        if expanded is not None:
            yield expanded
            if isinstance(expanded, CommandRefused):
                return
        run = AgentRun(self._client, self._messages, toolbox, self._tools.host, self._approve, self._config,
                       self._model, self._sampling, self._context, self._tools.always_allowed())
        with self._lock:
            self._run = run
        if self._cancelled.is_set():
            return
        for event in run.run():  # a call's step is the loop's to change: the GUI gets a copy
            yield replace(event, step=copy_step(event.step)) if isinstance(event, StepEvent) else event

    def _expand_command(self) -> PromptExpanded | CommandRefused | None:
        """The last message, when it is a `/name …` line naming one of the chat's MCP prompts, becomes
        that prompt's messages (the servers are running by now, so their prompts are known)."""
        last = self._messages[-1] if self._messages else {}
        if last.get("role") != "user" or not str(last.get("content", "")).startswith("/"):
            return None
        try:
            parsed = parse_command(last["content"], self._tools.prompts_for(self._settings))
        except PromptCommandError as exc:
            return CommandRefused(str(exc))
        if parsed is None:
            return None
        prompt, arguments = parsed
        try:
            messages = self._tools.host.get_prompt(prompt.server, prompt.name, arguments)
        except Exception as exc:  # noqa: BLE001 - the server's failure, said in the chat
            return CommandRefused(f"/{prompt.name} failed on {prompt.server}: {exc}")
        self._messages[-1:] = messages
        return PromptExpanded("\n\n".join(m["content"] for m in messages if m["role"] == "user"))

    def _approve(self, step: ToolStep, tool: ToolInfo) -> Approval:
        """On the loop's thread: ask, and wait for the answer (or the Stop that answers DENY)."""
        question: Future = Future()
        with self._lock:
            if self._cancelled.is_set():
                return Approval.DENY
            self._question = question
        try:
            self._ask(copy_step(step), tool, question)
            return question.result()
        finally:
            with self._lock:
                self._question = None

    @property
    def model(self) -> str | None:
        """The model the server says wrote the last reply (None before its first chunk)."""
        stream = self._client.stream
        return stream.model if stream is not None else None

    def cancel(self) -> None:
        """Stop now (any thread): the open reply or call is cancelled, a pending question answered DENY."""
        self._cancelled.set()
        with self._lock:
            run, question = self._run, self._question
        if run is not None:
            run.cancel()
        if question is not None:
            answer(question, Approval.DENY)


def copy_step(step: ToolStep) -> ToolStep:
    return ToolStep.from_json(step.to_json())
