"""Ollama's /api/pull: a model downloaded into the store, its progress streamed as Ollama does.

The downloads live in the app (its download manager, catalog and hub client), which the engine
must not import, so the app hands the server a `Puller` when it starts one (`ember serve`, the
desktop app's engine). A server started without one (`python -m engine serve`) answers 501 saying
so. The puller resolves the name first, so an unknown model is a 404 before any stream starts;
a failure during the download is the stream's last line, {"error": ...}, as Ollama sends it.
"""
from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import asdict, dataclass
from typing import Callable, Iterator, Protocol

from fastapi.responses import JSONResponse, StreamingResponse

from engine.server.errors import APIError

NDJSON = "application/x-ndjson"


@dataclass(frozen=True)
class PullProgress:
    """One line of Ollama's pull stream: "pulling manifest", "pulling <digest>" with byte counts,
    "verifying sha256 digest", "writing manifest", "success"."""
    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


class PullError(Exception):
    """A pull that cannot start (status 404: no such model; 400: a name Ember cannot pull) or
    that failed while downloading (500); the message is the user's."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Puller(Protocol):
    def start(self, name: str) -> Iterator[PullProgress]:
        """Resolve `name` and return the download's progress; raises PullError for a name it
        cannot pull. Iterating blocks (it runs on a worker thread) and raises PullError on failure."""


_DONE = object()


async def _pump(progress: Iterator[PullProgress]):
    """The blocking iterator's items, from a worker thread, without holding the event loop."""
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()

    def work() -> None:
        try:
            for item in progress:
                loop.call_soon_threadsafe(queue.put_nowait, item)
        except Exception as e:  # noqa: BLE001 - handed to the stream as its error line
            loop.call_soon_threadsafe(queue.put_nowait, e)
        loop.call_soon_threadsafe(queue.put_nowait, _DONE)

    threading.Thread(target=work, name="api-pull", daemon=True).start()
    while (item := await queue.get()) is not _DONE:
        yield item


async def pull_reply(puller: Puller | None, name: str, stream: bool, error: Callable[[int, str], JSONResponse]):
    """The /api/pull response: NDJSON progress lines, or (stream false) the last line alone."""
    if puller is None:
        raise APIError(501, "this server cannot download models: start it with `ember serve` or from "
                            "the desktop app, or use `ember models pull`")
    try:
        progress = await asyncio.to_thread(puller.start, name)
    except PullError as e:
        raise APIError(e.status, str(e)) from None

    async def lines():
        async for item in _pump(progress):
            if isinstance(item, Exception):
                yield json.dumps({"error": str(item)}) + "\n"
                return
            yield json.dumps(item.to_dict()) + "\n"

    if stream:
        return StreamingResponse(lines(), media_type=NDJSON)
    last = {}
    async for line in lines():
        last = json.loads(line)
    if "error" in last:
        return error(500, last["error"])
    return last
