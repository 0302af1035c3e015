"""POST /v1/completions, streaming (SSE) or not (chat is in chat_routes.py).

A handler validates, builds the prompt, submits to the engine thread and awaits its own queue.
It waits for the first result before answering, so an error the engine finds (a prompt that
does not fit, a bad token id) is still a proper 4xx and not a broken stream.
"""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.server.openai import bodies as R
from engine.server.errors import APIError
from engine.server.openai.protocol import CompletionRequest
from engine.server.model_use import use_model
from engine.server.serving import Job, check_token_ids, encode, fit_context, sampling_params
from engine.server.sse import SSE_HEADERS, job_events


def build_completions_router() -> APIRouter:
    router = APIRouter()

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        state = request.app.state
        loaded = await use_model(request, body.model)
        engine, model = loaded.engine, loaded.spec.id
        scoring = body.echo and body.logprobs is not None
        requested = 16 if body.max_tokens is None else body.max_tokens
        plans = await _plan(body, engine, requested, scoring)
        if requested == 0 and not scoring:  # nothing to run: the prompt (if echoed) and no tokens
            return JSONResponse(_echo_only(body, plans, model))
        rid = R.new_id("cmpl")
        job = Job(state.engine_thread, request)
        index, choices = _submit(job, body, engine, plans, rid, requested, scoring)
        await job.first()
        created = R.now()
        if body.stream:
            return StreamingResponse(_completion_stream(job, index, choices, rid, model, created, body),
                                     media_type="text/event-stream", headers=SSE_HEADERS)
        await _collect(job, index, choices)
        return JSONResponse(R.completion(rid, model, created, [c.final() for c in choices], _usage(choices)))

    return router


async def _plan(body: CompletionRequest, engine, requested: int, scoring: bool) -> list[tuple]:
    """Each prompt as (token ids that fit the context, max_tokens, echo text)."""
    plans = []
    for p in body.prompts:
        ids = await encode(engine, p) if isinstance(p, str) else list(p)
        check_token_ids(ids, engine.tokenizer.vocab_size)
        if not ids:
            raise APIError(400, "the prompt is empty", param="prompt", code="invalid_value")
        # scoring with max_tokens 0: the engine samples one token, which we drop
        want = requested or (1 if scoring else 0)
        kept, max_tokens = fit_context(ids, want, body.truncate_prompt_tokens,
                                       engine.max_model_len, what="prompt", fit=body.max_tokens_fit)
        echo = (p if isinstance(p, str) and len(kept) == len(ids)
                else engine.tokenizer.decode(kept)) if body.echo else ""
        plans.append((kept, max_tokens, echo))
    return plans


def _echo_only(body: CompletionRequest, plans: list[tuple], model: str) -> dict:
    """max_tokens 0 without logprobs: the echoed prompts and no tokens, nothing run."""
    choices = [R.completion_choice(p * body.n + j, e, "length", None)
               for p, (_, _, e) in enumerate(plans) for j in range(body.n)]
    use = R.usage(sum(len(k) for k, _, _ in plans), 0)
    return R.completion(R.new_id("cmpl"), model, R.now(), choices, use)


def _submit(job: Job, body: CompletionRequest, engine, plans: list[tuple], rid: str, requested: int,
            scoring: bool) -> tuple[dict, list]:
    """One engine request per prompt and choice; returns request id -> choice index, and the choices."""
    vocab = engine.tokenizer.vocab_size
    tt = R.TokenText(engine.tokenizer)
    index, choices = {}, []
    for p, (ids, max_tokens, echo) in enumerate(plans):
        for j in range(body.n):  # OpenAI's order: prompt 0's n choices, then prompt 1's...
            i = p * body.n + j
            params = sampling_params(body, max(max_tokens, 1), vocab, body.logprobs,
                                     body.logprobs if scoring else None, choice=j)
            sub = f"{rid}-{i}"
            index[sub] = i
            job.submit(ids, params, sub, engine)
            choices.append(_Choice(i, ids, echo, body, tt, drop_output=requested == 0))
            if j:  # usage counts each prompt once, however many choices it has
                choices[-1].prompt_tokens = 0
    return index, choices


async def _collect(job: Job, index: dict, choices: list) -> None:
    """Feed every result to its choice until all are finished (the non-streaming reply)."""
    try:
        async for rid, out in job:
            choices[index[rid]].add(out)
    finally:
        job.close()


def _usage(choices: list) -> dict:
    return R.usage(sum(c.prompt_tokens for c in choices), sum(c.completion_tokens for c in choices),
                   sum(c.cached for c in choices), sum(c.drafted for c in choices), sum(c.accepted for c in choices))


class _Choice:
    """One prompt's choice in a completions response, filled from its RequestOutputs."""

    def __init__(self, index: int, ids: list[int], echo: str, body: CompletionRequest,
                 tt: R.TokenText, drop_output: bool) -> None:
        self.index, self.ids, self.body, self.drop = index, ids, body, drop_output
        self.text = echo
        self.pending = echo  # text not yet sent in a stream chunk
        self.lp = R.CompletionLogprobs(tt) if body.logprobs is not None else None
        self.echoed = not body.echo
        self.reason, self.prompt_tokens, self.completion_tokens, self.cached = None, len(ids), 0, 0
        self.drafted = self.accepted = 0  # speculative decoding's draft tokens, verified / accepted

    def add(self, out) -> None:
        if not self.echoed and self.lp is not None:
            plps = out.prompt_logprobs or [None] * len(self.ids)
            for tok, lp in zip(self.ids, plps):
                self.lp.add(tok, lp)
        self.echoed = True
        if not self.drop:
            self.text += out.new_text
            self.pending += out.new_text
            if self.lp is not None:
                for tok, lp in zip(out.new_token_ids, out.logprobs or [None] * len(out.new_token_ids)):
                    self.lp.add(tok, lp)
            self.completion_tokens = len(out.output_token_ids)
        self.drafted, self.accepted = out.num_spec_proposed, out.num_spec_accepted
        if out.finished:
            self.reason = "length" if self.drop else out.finish_reason
            self.cached = out.num_cached_tokens

    def chunk(self) -> dict:
        text, self.pending = self.pending, ""
        return R.completion_choice(self.index, text, self.reason,
                                   self.lp.take() if self.lp is not None else None)

    def final(self) -> dict:
        lp = self.lp.take() if self.lp is not None else None
        return R.completion_choice(self.index, self.text, self.reason, lp)


def _completion_stream(job, index, choices, rid, model, created, body: CompletionRequest):
    with_usage = body.include_usage

    def emit(item):
        c = choices[index[item[0]]]
        c.add(item[1])
        if c.pending or c.reason is not None or (c.lp is not None and c.lp.tokens):
            yield R.completion_chunk(rid, model, created, c.chunk(), with_usage)

    def done():
        if with_usage:
            yield R.usage_chunk(rid, model, created, "text_completion", _usage(choices))

    return job_events(job, emit, done)
