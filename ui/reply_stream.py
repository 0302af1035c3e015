"""One streamed reply as a plain, Qt-free generator that the GUI thread can cancel at once."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from app.client import ChatDelta, ChatStream, EngineClient


class ReplyStream:
    """A Qt-free, cancellable stream of ChatDeltas; `cancel()` may be called from the GUI thread.

    `run()` is the generator the worker iterates; cancelling shuts the socket down, so a read that
    is blocked waiting for the next token returns at once and the engine aborts the sequence. The
    request names the chat's own model: the engine loads it just in time beside the others.
    """

    def __init__(self, client: EngineClient, messages: list[dict], **kwargs: Any) -> None:
        self._client, self._messages, self._kwargs = client, messages, kwargs
        self._stream: ChatStream | None = None
        self._cancelled = False

    def run(self) -> Iterator[ChatDelta]:
        if self._cancelled:
            return
        self._stream = self._client.chat_stream(self._messages, **self._kwargs)
        if self._cancelled:  # cancelled while the request was being sent
            self._stream.close()
            return
        try:
            yield from self._stream
        finally:
            self._stream.close()

    @property
    def model(self) -> str | None:
        """The model the server says wrote the reply (None before its first chunk)."""
        return self._stream.model if self._stream is not None else None

    def cancel(self) -> None:
        self._cancelled = True
        stream = self._stream
        if stream is not None:
            stream.cancel()
