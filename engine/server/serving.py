"""From a validated request to engine work: pick the model, build the prompt, fit the context,
turn OpenAI's knobs into SamplingParams, and wait on the engine thread's results.

Shared by every wire protocol's routes (engine/server/openai/, ollama/, anthropic/).
"""
from __future__ import annotations

import asyncio
import contextlib
import time

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from engine.llm_engine import ContextLengthError
from engine.sampling_params import SamplingParams
from engine.service.handle import EngineHandle, EngineUnavailable
from engine.server.errors import APIError
from engine.server.openai.protocol import SamplingRequest


async def encode(engine, text: str) -> list[int]:
    """Tokenize off the event loop: a long prompt must not stall every other stream."""
    return await run_in_threadpool(engine.tokenizer.encode, text)


def fit_context(ids: list[int], max_tokens: int | None, truncate: int | None, ctx: int,
                what: str = "messages", fit: bool = False) -> tuple[list[int], int]:
    """Returns (prompt ids, max_tokens) that fit `ctx`, or raises context_length_exceeded.

    max_tokens None means "until the context is full" (OpenAI's chat default). With
    `truncate_prompt_tokens` the prompt keeps only its last tokens: k of them, or for -1 as
    many as leave room for the reply (max_tokens, or a quarter of the context).
    """
    if truncate is not None and truncate != 0:
        reserve = max_tokens if max_tokens else max(1, ctx // 4)
        keep = max(1, ctx - reserve) if truncate == -1 else truncate
        keep = min(keep, ctx - 1)
        if len(ids) > keep:
            ids = ids[len(ids) - keep:]
    n = len(ids)
    if n >= ctx:
        raise APIError(400, f"This model's maximum context length is {ctx} tokens. However, your "
                       f"{what} resulted in {n} tokens. Shorten the {what}, or set "
                       "truncate_prompt_tokens (-1 keeps what fits).",
                       code="context_length_exceeded", param=what)
    room = ctx - n
    if max_tokens is None or (fit and max_tokens > room):  # fit: the reply stops where the context ends
        return ids, room
    if max_tokens > room:
        raise APIError(400, f"This model's maximum context length is {ctx} tokens. However, you "
                       f"requested {n + max_tokens} tokens ({n} in the {what}, {max_tokens} in the "
                       "completion). Reduce the length of the messages or the completion.",
                       code="context_length_exceeded", param="max_tokens")
    return ids, max_tokens


def sampling_params(req: SamplingRequest, max_tokens: int, vocab_size: int, logprobs: int | None,
                    prompt_logprobs: int | None = None, grammar=None, choice: int = 0) -> SamplingParams:
    """`choice` i of n > 1 draws with seed + i: the choices differ, and the same seed gives the
    same n texts again."""
    top_k = req.top_k if req.top_k > 0 else 0
    bias = req.token_bias
    bad = next((t for t in bias if t >= vocab_size), None)
    if bad is not None:
        raise APIError(400, f"logit_bias names token id {bad}, outside the vocabulary (size {vocab_size})",
                       code="invalid_value", param="logit_bias")
    seed = None if req.seed is None else (req.seed + choice + 2**63) % 2**64 - 2**63
    try:
        return SamplingParams(
            temperature=req.temperature, top_k=min(top_k, vocab_size), top_p=req.top_p,
            min_p=req.min_p, repetition_penalty=req.repetition_penalty,
            frequency_penalty=req.frequency_penalty, presence_penalty=req.presence_penalty,
            seed=seed, max_tokens=max_tokens, stop=req.stop_list, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs, ignore_eos=req.ignore_eos, priority=req.priority,
            logit_bias=bias, grammar=grammar, speculative=req.speculative != "off")
    except ValueError as e:
        raise APIError(400, str(e), code="invalid_value") from None


def check_token_ids(ids: list[int], vocab_size: int) -> None:
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is outside the vocabulary (size {vocab_size})",
                       code="invalid_value", param="prompt")


def engine_error(e: BaseException) -> APIError:
    """An error that came back from the engine thread, as an HTTP error."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, ContextLengthError):
        return APIError(400, str(e), code="context_length_exceeded")
    if isinstance(e, EngineUnavailable):
        return APIError(503, str(e), code="model_not_loaded")
    if isinstance(e, ValueError):
        return APIError(400, str(e), code="invalid_value")
    return APIError(500, f"the engine failed: {e}", code="internal_error")


class Job:
    """Requests submitted for one HTTP call (one per prompt), read back from one queue.

    `async for rid, out in job` reads their outputs. A watcher task reads the connection's ASGI
    `receive`: when the client goes away it aborts every unfinished request at once, so the
    engine frees their KV blocks on its next step.
    """

    def __init__(self, thread: EngineHandle, request: Request | None, metered: bool = True) -> None:
        """`request`: the HTTP call whose hang-up aborts the job (None: background work). Not
        `metered` (a warm): its prompt, first token and speed stay out of /metrics."""
        self.thread, self.request, self.metered = thread, request, metered
        self.queue: asyncio.Queue = asyncio.Queue()
        self.loop = asyncio.get_running_loop()
        self.unfinished: set[str] = set()
        self.t0 = time.monotonic()
        self.first_token_at: dict[str, float] = {}
        self._watcher: asyncio.Task | None = None
        self._first: tuple | None = None  # first()'s output, which iteration yields first

    def submit(self, ids: list[int], params: SamplingParams, rid: str, engine, images: list = ()) -> None:
        """`images`: the prompt's image spans (engine/server/chat_images.py), for a vision model."""
        def sink(item, rid=rid):  # engine thread
            try:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, (rid, item))
            except RuntimeError:  # the loop is gone: nobody listens any more
                pass
        self.unfinished.add(rid)
        self.thread.submit_sink(ids, params, rid, engine, sink, list(images))
        if self.metered:
            self.thread.metrics.prompt_tokens.inc(len(ids))
        if self._watcher is None and self.request is not None:
            self._watcher = asyncio.create_task(self._watch())

    async def _next(self):
        """(request id, RequestOutput); raises the first error as an APIError."""
        rid, item = await self.queue.get()
        if isinstance(item, BaseException):
            self.unfinished.discard(rid)
            raise engine_error(item)
        if item.new_token_ids and rid not in self.first_token_at and self.metered:
            self.first_token_at[rid] = now = time.monotonic()
            self.thread.metrics.ttft.observe(now - self.t0)
        if item.finished:
            self.unfinished.discard(rid)
            if self.metered:
                self._record(rid, item)
        return rid, item

    async def first(self):
        """Wait for the first output, so that an error the engine finds is still a proper 4xx and
        not a broken stream; iterating the job yields it again first. If it fails (or the handler
        is cancelled) the job is closed, so its sequences are aborted before the error reaches
        the client."""
        try:
            self._first = await self._next()
        except BaseException:
            self.close()
            raise
        return self._first

    async def __aiter__(self):
        """Every (request id, RequestOutput) until each request has finished: the one `first()`
        received, then the rest as they come. An engine error is raised as an APIError."""
        if self._first is not None:
            item, self._first = self._first, None
            yield item
        while self.unfinished:
            yield await self._next()

    def _record(self, rid: str, out) -> None:
        m = self.thread.metrics
        m.cached_tokens.inc(out.num_cached_tokens)
        n = len(out.output_token_ids)
        first = self.first_token_at.get(rid)
        if first is not None and n > 1:
            dt = time.monotonic() - first
            if dt > 0:
                m.tok_s.observe((n - 1) / dt)

    async def _watch(self) -> None:
        with contextlib.suppress(Exception):
            while True:
                message = await self.request.receive()
                if message["type"] == "http.disconnect":
                    self.abort()
                    return

    def abort(self) -> None:
        for rid in list(self.unfinished):
            self.thread.abort(rid)
        self.unfinished.clear()

    def close(self) -> None:
        """Always called when the handler (or its stream) ends, normally or not."""
        self.abort()
        if self._watcher is not None:
            self._watcher.cancel()
