"""What one tool call was, as data: the loop makes it, the transcript draws it, the chat store keeps it."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum, StrEnum
from typing import Any


class CallStatus(StrEnum):
    RUNNING = "running"
    OK = "ok"
    ERROR = "error"              # the tool ran and reported an error (isError), or the call failed
    DENIED = "denied"            # the user said no
    INVALID = "invalid"          # arguments that are not JSON or break the tool's schema: never sent
    TIMEOUT = "timeout"          # cancelled after the call timeout
    UNAVAILABLE = "unavailable"  # no such tool, or its server failed to start or crashed
    CANCELLED = "cancelled"      # the user stopped the reply while it ran


class Approval(Enum):
    ONCE = "once"
    ALWAYS = "always"  # for this tool, from now on
    DENY = "deny"


@dataclass(slots=True)
class ToolStep:
    """One call the model made and what went back to it."""

    call_id: str
    name: str          # as the model called it (server-prefixed when two servers share a tool name)
    arguments: str     # JSON text, as the model wrote it
    server: str = ""   # "" when the name matches no tool
    tool: str = ""     # the server's own name for it
    status: CallStatus = CallStatus.RUNNING
    result: str = ""   # the text the model gets back (the tool's output, or why there is none)
    seconds: float | None = None
    truncated: bool = False  # the result was cut to fit the context
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status not in (CallStatus.OK, CallStatus.RUNNING)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["status"] = self.status.value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolStep:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        known["status"] = CallStatus(known.get("status", CallStatus.ERROR))
        return cls(**known)

    def arguments_object(self) -> Any:
        """The arguments parsed, or the text itself when it is not JSON."""
        try:
            return json.loads(self.arguments) if self.arguments.strip() else {}
        except json.JSONDecodeError:
            return self.arguments


def steps_json(steps: list[ToolStep]) -> str:
    return json.dumps([s.to_json() for s in steps])


def steps_from_json(text: str | None) -> list[ToolStep]:
    if not text:
        return []
    try:
        return [ToolStep.from_json(d) for d in json.loads(text)]
    except (ValueError, TypeError, KeyError):
        return []
