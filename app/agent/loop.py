"""The agent loop, without Qt: reply -> tool calls -> approval -> calls -> results as `tool` messages ->
the next reply, until a reply without calls, the step limit, or the user's Stop.

One loop for the window and the CLI. `AgentRun.run()` is a generator of events (the reply's ChatDeltas,
a new reply beginning, a call starting and ending) that a GUI worker or a terminal iterates; approval
is a blocking callable the caller supplies (a dialog answered on the GUI thread, a prompt on a terminal).
The engine writes `tools` into the model's template and parses its calls; this loop never reads syntax.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from app.agent.mcp_connection import ServerUnavailable, ToolInfo
from app.agent.mcp_host import McpHost, ToolTimeout
from app.agent.steps import Approval, CallStatus, ToolStep
from app.agent.toolbox import Toolbox, check_arguments, cut_result
from app.client import ChatDelta

# English runs 3-4 characters a token, but digits are a token each in most vocabularies and a CJK
# character can be two or three byte tokens: one is the figure under which a cut result still fits
CHARS_PER_TOKEN = 1


@dataclass(frozen=True, slots=True)
class AgentConfig:
    step_limit: int = 10          # replies that may call tools before the loop stops asking
    call_timeout_s: float = 60.0
    max_result_chars: int = 32_000


@dataclass(frozen=True, slots=True)
class ReplyStarted:
    """A new assistant reply begins (the first, or the one after a round of calls); it is yielded with
    the reply's first text, and `t_sent` (time.monotonic()) says when its request went out."""
    round: int
    t_sent: float = 0.0


@dataclass(frozen=True, slots=True)
class StepEvent:
    """A call started (`step.status` RUNNING) or ended; `approval` is the user's answer, if asked."""
    step: ToolStep
    approval: Approval | None = None


@dataclass(frozen=True, slots=True)
class StepLimitReached:
    """The loop has run `limit` rounds of calls: the next reply is asked for without tools."""
    limit: int


AgentEvent = ChatDelta | ReplyStarted | StepEvent | StepLimitReached
Approve = Callable[[ToolStep, ToolInfo], Approval]


@dataclass(slots=True)
class _Reply:
    text: str = ""
    reasoning: str = ""
    calls: tuple = ()
    usage: Any = None
    finish_reason: str | None = None
    t_sent: float = 0.0


@dataclass
class AgentRun:
    """One user turn run to its answer. `messages` grows with each reply and tool result, in the
    OpenAI shape the engine's templates take; the caller keeps it (history) when the run ends."""

    client: Any                      # EngineClient, or anything with its chat_stream
    messages: list[dict]
    toolbox: Toolbox
    host: McpHost
    approve: Approve
    config: AgentConfig = field(default_factory=AgentConfig)
    model: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    context_tokens: int | None = None       # the model's context: results are cut to what is left of it
    always_allowed: set[tuple[str, str]] = field(default_factory=set)  # (server, tool)
    _cancelled: threading.Event = field(default_factory=threading.Event)
    _stream: Any = None

    def cancel(self) -> None:
        """Stop now (any thread): the open reply's socket closes, a running call is cancelled."""
        self._cancelled.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def run(self) -> Iterator[AgentEvent]:
        # A small model that has its result often calls the same tool again with the same arguments
        # (Qwen2.5-Coder-1.5B does, every time). A repeat learns nothing: a reply that only repeats
        # calls already answered is dropped unseen, and asked for again without tools, so it answers.
        done: dict[tuple[str, str], ToolStep] = {}
        with_tools = True
        for round_ in range(self.config.step_limit + 1):
            if self.cancelled:
                return
            if round_ == self.config.step_limit:  # the last reply is asked for without tools: an answer
                yield StepLimitReached(self.config.step_limit)
            reply = _Reply()
            held: list[ChatDelta] | None = []  # deltas before the first text: a dropped reply is never seen
            for delta in self._reply(reply, with_tools=with_tools and round_ < self.config.step_limit):
                if held is not None and not (delta.text or delta.reasoning):
                    held.append(delta)
                    continue
                if held is not None:
                    yield ReplyStarted(round_, reply.t_sent)
                    yield from held
                    held = None
                yield delta
            if self.cancelled:
                return
            steps = [ToolStep(c.id or f"call_{round_}_{i}", c.name, c.arguments) for i, c in enumerate(reply.calls)]
            if held is not None and steps and all(_call_key(s) in done for s in steps) and with_tools:
                with_tools = False
                continue
            if held is not None:
                yield ReplyStarted(round_, reply.t_sent)
                yield from held
            if not steps:
                return
            self.messages.append(assistant_message(reply.text, steps))
            for step in steps:
                earlier = done.get(_call_key(step))
                if earlier is not None:
                    yield StepEvent(self._repeat(step, earlier))
                else:
                    yield from self._run_step(step, self._result_limit(reply.usage))
                    done[_call_key(step)] = step
                self.messages.append(tool_message(step))
                if self.cancelled:
                    return
            with_tools = True

    @staticmethod
    def _repeat(step: ToolStep, earlier: ToolStep) -> ToolStep:
        step.server, step.tool, step.status, step.result = earlier.server, earlier.tool, earlier.status, earlier.result
        step.seconds, step.extra["repeat_of"] = 0.0, earlier.call_id
        return step

    def _reply(self, reply: _Reply, with_tools: bool) -> Iterator[ChatDelta]:
        extra = {"tools": self.toolbox.openai_tools()} if self.toolbox and with_tools else {}
        reply.t_sent = time.monotonic()
        self._stream = self.client.chat_stream(self.messages, self.model, **self.sampling, **extra)
        if self.cancelled:
            self._stream.close()
            return
        try:
            for delta in self._stream:
                reply.text += delta.text
                reply.reasoning += delta.reasoning
                reply.calls = delta.tool_calls or reply.calls
                reply.usage = delta.usage or reply.usage
                reply.finish_reason = delta.finish_reason or reply.finish_reason
                yield delta
        finally:
            self._stream.close()
            self._stream = None

    def _result_limit(self, usage: Any) -> int:
        limit = self.config.max_result_chars
        if self.context_tokens and usage is not None:
            reply_room = self.sampling.get("max_tokens") or 256
            left = self.context_tokens - usage.total_tokens - reply_room - 128  # 128: the template's markup
            limit = min(limit, max(256, left * CHARS_PER_TOKEN))
        return limit

    def _run_step(self, step: ToolStep, limit_chars: int) -> Iterator[StepEvent]:
        tool = self.toolbox.find(step.name)
        if tool is None:
            yield StepEvent(self._end(step, CallStatus.UNAVAILABLE, f"error: there is no tool named {step.name!r}"))
            return
        step.server, step.tool = tool.server, tool.name
        arguments, problem = check_arguments(tool, step.arguments)
        if problem is not None:
            yield StepEvent(self._end(step, CallStatus.INVALID, f"error: {problem}. The tool was not called."))
            return
        approval = None
        if (tool.server, tool.name) not in self.always_allowed:
            approval = self.approve(step, tool)
            if approval is Approval.ALWAYS:
                self.always_allowed.add((tool.server, tool.name))
            if self.cancelled:
                yield StepEvent(self._end(step, CallStatus.CANCELLED, "error: the user stopped the reply"), approval)
                return
            if approval is Approval.DENY:
                yield StepEvent(self._end(step, CallStatus.DENIED, "The user denied this tool call."), approval)
                return
        yield StepEvent(replace(step, extra=dict(step.extra)), approval)  # a snapshot: the call is running
        yield StepEvent(self._call(step, tool, arguments, limit_chars), approval)

    def _call(self, step: ToolStep, tool: ToolInfo, arguments: dict, limit_chars: int) -> ToolStep:
        t0 = time.perf_counter()
        try:
            out = self.host.call_tool(tool.server, tool.name, arguments, self.config.call_timeout_s, self._cancelled)
        except ToolTimeout as exc:
            status = CallStatus.CANCELLED if self.cancelled else CallStatus.TIMEOUT
            return self._end(step, status, f"error: {exc}", t0)
        except ServerUnavailable as exc:
            return self._end(step, CallStatus.UNAVAILABLE, f"error: {exc}", t0)
        text, step.truncated = cut_result(out.text, limit_chars)
        return self._end(step, CallStatus.ERROR if out.is_error else CallStatus.OK, text, t0)

    @staticmethod
    def _end(step: ToolStep, status: CallStatus, result: str, t0: float | None = None) -> ToolStep:
        step.status, step.result = status, result
        step.seconds = None if t0 is None else time.perf_counter() - t0
        return step


def _call_key(step: ToolStep) -> tuple[str, str]:
    """A call's identity: its name and its arguments, whatever their spacing or key order."""
    try:
        return step.name, json.dumps(json.loads(step.arguments or "{}"), sort_keys=True)
    except ValueError:
        return step.name, step.arguments


def assistant_message(text: str, steps: list[ToolStep]) -> dict:
    """The reply that made calls, as the next request must carry it (OpenAI's shape)."""
    return {"role": "assistant", "content": text,
            "tool_calls": [{"id": s.call_id, "type": "function",
                            "function": {"name": s.name, "arguments": s.arguments or "{}"}} for s in steps]}


def tool_message(step: ToolStep) -> dict:
    return {"role": "tool", "tool_call_id": step.call_id, "name": step.name, "content": step.result}


def history_messages(text: str, steps: list[ToolStep]) -> list[dict]:
    """A stored reply with its calls, back into request messages: the call, then each result."""
    return [assistant_message(text, steps), *(tool_message(s) for s in steps)] if steps else [
        {"role": "assistant", "content": text}]
