"""Server-sent events: one `data:` line per JSON chunk, `[DONE]` at the end (OpenAI's stream)."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator

from engine.server.errors import APIError, error_body
from engine.server.serving import Job

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(data) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def job_events(job: Job, emit, done, end: str | None = "data: [DONE]\n\n") -> AsyncIterator[str]:
    """Drive a job as SSE: `emit(item)` yields chunks per output, `done()` the closing ones.
    Closing the generator (client gone) aborts the unfinished requests in `job.close()`."""
    try:
        try:
            async for item in job:
                for chunk in emit(item):
                    yield chunk if isinstance(chunk, str) else sse(chunk)
        except APIError as e:  # the engine failed or the model was switched mid-stream
            yield sse(error_body(e.status, e.message, e.code))
        for chunk in done():
            yield chunk if isinstance(chunk, str) else sse(chunk)
        if end:
            yield end
    finally:
        job.close()
