"""One message as the transcript shows it: its text, status, the replies Regenerate wrote and which one
is shown, and what the reader opened (tool calls, thoughts). Qt-free; `from_history` builds a chat's
messages from the chat store's rows, `api_messages` the next request's messages from them (a reply
that ran tools as its call and the tool results, as the model's template expects them)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.agent.loop import history_messages
from app.agent.steps import ToolStep
from app.doc_sources import Source
from app.history_images import ImageRef, image_parts

if TYPE_CHECKING:
    from app.history import Message
    from app.reply_versions import ReplyVersions


@dataclass
class TranscriptMessage:
    role: str
    content: str
    status: str = "done"  # done | streaming | stopped | error
    error: str | None = None
    msg_id: int | None = None  # its row in the chat store
    versions: list[str] = field(default_factory=list)  # every reply a Regenerate wrote here (this session)
    shown: int = 0  # which of `versions` `content` is
    opened: set[int] = field(default_factory=set)  # the tool calls shown with their arguments
    reasoning: str = ""  # a reasoning model's thinking (reasoning_content)
    thought_s: float | None = None  # how long it thought: set when the answer begins
    show_thinking: bool = False  # the thoughts opened by a click
    finish_reason: str | None = None  # the server's (stop, length, ...)
    model: str | None = None  # the model that wrote a reply (its id)
    tok_s: float | None = None  # its speed and first-token time, as the client measured them
    ttft: float | None = None
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments JSON), as the server parsed them
    pending: str = ""  # what a reply that has not begun waits for ("Waiting for memory: 1 ahead")
    steps: list[ToolStep] = field(default_factory=list)  # the calls an agent ran for this reply, with results
    notices: list[str] = field(default_factory=list)  # lines about the reply: a server that failed, the step limit
    whole: set[int] = field(default_factory=set)  # the steps whose long result is shown in full
    sources: list[Source] = field(default_factory=list)  # the passages of the user's documents it was given
    images: list[ImageRef] = field(default_factory=list)  # the pictures of a user's message

    @property
    def out_of_budget(self) -> bool:
        """It thought until max_tokens ran out and never began its answer (a reply stored without its
        finish reason counts when it has thoughts and no answer)."""
        return (self.role == "assistant" and self.status == "done" and bool(self.reasoning)
                and not self.content.strip() and self.finish_reason in ("length", None))

    def add_version(self) -> None:
        """The reply just written becomes the newest version (after the earlier ones it replaced)."""
        if self.content and (not self.versions or self.versions[-1] != self.content):
            self.versions.append(self.content)
        self.shown = max(0, len(self.versions) - 1)

    def flip(self, step: int) -> bool:
        """Show the previous (-1) or next (+1) version; False at either end."""
        j = self.shown + step
        if len(self.versions) < 2 or not 0 <= j < len(self.versions):
            return False
        self.shown, self.content = j, self.versions[j]
        return True


def from_history(rows: list[Message], versions: ReplyVersions | None) -> list[TranscriptMessage]:
    """A stored chat as transcript messages, with each reply's earlier versions when they are kept."""
    msgs = []
    for m in rows:
        status = "stopped" if m.status == "streaming" else m.status  # a reply cut off by a crash of the app
        msg = TranscriptMessage(m.role, m.content, status,
                                "the reply was interrupted" if status == "error" else None, msg_id=m.id,
                                reasoning=m.reasoning, thought_s=m.thought_s, finish_reason=m.finish_reason,
                                model=m.model, tok_s=m.tok_s, ttft=m.ttft, tool_calls=m.tool_calls,
                                steps=m.tool_steps, notices=m.notices, sources=m.sources,
                                images=m.images)
        if m.role == "assistant" and versions is not None:
            kept, shown = versions.get(m.id)
            if kept and kept[shown] == m.content:  # the one shown is the one stored
                msg.versions, msg.shown = kept, shown
        msgs.append(msg)
    return msgs


def api_messages(messages: list[TranscriptMessage], system: str | None,
                 image_uri: Callable[[ImageRef], str | None] | None = None) -> list[dict]:
    """What the next request sends: the system prompt, then each question and answer shown (no
    failed reply, nothing empty); a reply that ran tools as its calls and their results; a question
    with images as its text and `image_url` parts, every turn (`image_uri`: an image's data: URI, None
    when its file is gone)."""
    out = [{"role": "system", "content": system}] if system else []
    for m in messages:
        if m.role == "assistant" and m.steps:
            out += history_messages(m.content, m.steps)
        elif m.role == "user" and image_uri is not None and (uris := [u for u in map(image_uri, m.images) if u]):
            out.append({"role": "user", "content": image_parts(m.content, uris)})
        elif m.role in ("user", "assistant") and m.content and m.status != "error":
            out.append({"role": m.role, "content": m.content})
    return out
