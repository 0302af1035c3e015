"""A tool-using reply on a terminal: the text streamed to stdout, each call and its result on stderr
(so `ember generate --mcp F --yes PROMPT > answer.txt` keeps the answer alone), and the approval asked
on the terminal ("Allow once [y] / Always for this tool [a] / Deny [n]").
"""
from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from typing import TextIO

from app.agent.loop import StepEvent, StepLimitReached
from app.agent.mcp_connection import ToolInfo
from app.agent.steps import Approval, CallStatus, ToolStep
from app.client import ChatDelta

DIM, RED, PLAIN = "\033[2m", "\033[31m", "\033[0m"
MAX_SHOWN_CHARS, MAX_SHOWN_LINES = 600, 12  # a longer result (or arguments) is shortened on screen
NOT_A_TERMINAL = "(no terminal to ask on: stdin is not one; pass --yes to allow tool calls)"
ANSWERS = {"y": Approval.ONCE, "yes": Approval.ONCE, "a": Approval.ALWAYS, "always": Approval.ALWAYS,
           "n": Approval.DENY, "no": Approval.DENY, "": Approval.DENY}


def shorten(text: str, max_chars: int = MAX_SHOWN_CHARS, max_lines: int = MAX_SHOWN_LINES) -> str:
    """The start of a long text, with how long the whole is."""
    lines = text.splitlines() or [""]
    short = "\n".join(lines[:max_lines])[:max_chars]
    return short if short == text.rstrip("\n") else f"{short} ... ({len(text):,} characters in all)"


def _indented(text: str, indent: str) -> str:
    return text.replace("\n", "\n" + indent)


class TerminalView:
    """Prints one agent run's events and answers its approvals; `yes` allows every call unasked."""

    def __init__(self, yes: bool = False, out: TextIO | None = None, err: TextIO | None = None,
                 stdin: TextIO | None = None) -> None:
        self.yes = yes
        self.out, self.err, self.stdin = out or sys.stdout, err or sys.stderr, stdin or sys.stdin
        self.on_interrupt: Callable[[], None] = lambda: None  # the run's cancel, for Ctrl-C at the prompt
        self._shown: set[str] = set()  # calls already printed (at their approval or their start)
        self._thinking = False
        self._line_open = False  # stdout holds text not ended by a newline

    def _tty(self, stream: TextIO) -> bool:
        return getattr(stream, "isatty", lambda: False)()

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()
        if text:
            self._line_open = not text.endswith("\n")

    def _note(self, line: str, colour: str = "") -> None:
        """A line on stderr, after the reply's text has its own line."""
        if self._thinking:
            self._end_thinking("\n")
        if self._line_open:
            self._write("\n")
        if colour and self._tty(self.err):
            line = f"{colour}{line}{PLAIN}"
        self.err.write(line + "\n")
        self.err.flush()

    # ---- the reply's text ----
    def _end_thinking(self, gap: str) -> None:
        self._thinking = False
        self._write((PLAIN if self._tty(self.out) else "") + gap)

    def show_delta(self, delta: ChatDelta) -> None:
        if delta.reasoning:
            if not self._thinking:
                self._write(DIM if self._tty(self.out) else "Thinking: ")
                self._thinking = True
            self._write(delta.reasoning)
        if delta.text:
            if self._thinking:
                self._end_thinking("\n\n")
            self._write(delta.text)

    def finish(self, stopped: bool = False) -> None:
        """The end of a run: the colour back, " [stopped]" after Ctrl-C, and the last line ended."""
        if self._thinking:
            self._end_thinking("")
        if stopped:
            if self._line_open:
                self._write(" [stopped]")
            else:
                self._note("[stopped]")
        if self._line_open:
            self._write("\n")

    # ---- calls ----
    def show_call(self, step: ToolStep) -> None:
        if step.call_id in self._shown:
            return
        self._shown.add(step.call_id)
        where = f" on {step.server}" if step.server else ""
        arguments = _indented(shorten(step.arguments.strip() or "{}"), "    ")
        self._note(f"tool call: {step.tool or step.name}{where} {arguments}")

    def show_result(self, step: ToolStep) -> None:
        self.show_call(step)
        label = "result" if step.status is CallStatus.OK else step.status.value
        took = f" ({step.seconds:.2f} s)" if step.seconds is not None else ""
        if step.extra.get("repeat_of"):  # the loop answered it from the same call earlier in the turn
            took = " (a repeat: not run again)"
        cut = " [cut to fit the context]" if step.truncated else ""
        self._note(f"  {label}{took}{cut}: {_indented(shorten(step.result), '    ')}",
                   RED if step.failed else "")

    def show(self, event: object) -> None:
        if isinstance(event, ChatDelta):
            self.show_delta(event)
        elif isinstance(event, StepEvent):
            (self.show_call if event.step.status is CallStatus.RUNNING else self.show_result)(event.step)
        elif isinstance(event, StepLimitReached):
            self._note(f"({event.limit} rounds of tool calls, the --max-steps limit: now an answer without tools)")

    # ---- approval ----
    def approve(self, step: ToolStep, tool: ToolInfo) -> Approval:
        """The loop's `approve`: --yes allows; off a terminal, no; else the user's answer."""
        self.show_call(step)
        if self.yes:
            return Approval.ONCE
        if not self._tty(self.stdin):
            self._note(f"  {NOT_A_TERMINAL}", RED)
            return Approval.DENY
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.default_int_handler) if main else None  # Ctrl-C: no
        try:
            while True:
                self.err.write("  Allow once [y] / Always for this tool [a] / Deny [n]: ")
                self.err.flush()
                line = self.stdin.readline()
                if not line:  # end of input
                    return Approval.DENY
                answer = ANSWERS.get(line.strip().lower())
                if answer is not None:
                    return answer
        except KeyboardInterrupt:
            self.err.write("\n")
            self.on_interrupt()
            return Approval.DENY
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
