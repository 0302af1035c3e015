"""From a step's sampled tokens to what the caller sees: detokenizing, stop checks, the thinking
budget, pooling and finishing, for every request the engine holds (vLLM v1's OutputProcessor).

LLMEngine.step() is schedule -> execute -> process outputs; this is the last part. It holds each
request's text-side state (its detokenizer, stop-string matcher, text so far, timings, prompt
logprobs, thinking-budget count, pooled sum) and ends a request through `on_finish`, which the
engine passes in (the scheduler and the runner let the sequence go). No torch.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from engine.loaders.tokenizer import Tokenizer
from engine.outputs import RequestOutput
from engine.runner import RunnerOutput, TokenLogprobs
from engine.scheduler_output import SchedulerOutput
from engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class _Request:
    seq: Sequence
    detok: IncrementalDetokenizer
    stops: StopStringMatcher | None
    text: str = ""
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    prompt_logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    thinking: bool = False  # inside a <think> block (with a thinking budget)
    thought: int = 0  # tokens written inside it
    pooled: list[float] | None = None  # an embedding's sum of hidden rows so far (its chunks)


class OutputProcessor:
    """Every running request's text side; `on_finish(seq, status)` ends a sequence in the engine."""

    def __init__(self, tokenizer: Tokenizer, max_model_len: int,
                 on_finish: Callable[[Sequence, SequenceStatus], None]) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.on_finish = on_finish  # a stopping rule ended the sequence: the scheduler and runner let it go
        self._requests: dict[str, _Request] = {}
        self._pending_aborts: list[str] = []

    # ---- requests -------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        params = seq.params
        self._requests[seq.request_id] = _Request(
            seq, IncrementalDetokenizer(self.tokenizer, skip_special=not params.render_special),
            StopStringMatcher(params.stop) if params.stop else None,
            thinking=params.thinking_budget is not None and params.thinking_budget.starts_inside)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def abort(self, request_id: str) -> Sequence | None:
        """The request's sequence, its final output due from the next aborted(); None if unknown."""
        req = self._requests.get(request_id)
        if req is None:
            return None
        self._pending_aborts.append(request_id)
        return req.seq

    def aborted(self) -> list[RequestOutput]:
        """The final outputs of the requests aborted since the last call."""
        outputs = [self._finish(rid, "abort") for rid in self._pending_aborts if rid in self._requests]
        self._pending_aborts.clear()
        return outputs

    def unscheduled(self, out: SchedulerOutput) -> list[RequestOutput]:
        """The scheduler's preempted sequences restart their pooling (recomputed from their first
        token); those that could not fit the pool even alone end with reason "length"."""
        for seq in out.preempted:
            self._requests[seq.request_id].pooled = None
        return [self._finish(seq.request_id, "length", new_text=self._flush(self._requests[seq.request_id]))
                for seq in out.finished]

    # ---- a step's results -----------------------------------------------------------------
    def before_postprocess(self, out: SchedulerOutput, result: RunnerOutput) -> None:
        """What must be read before the scheduler appends the step's tokens: prompt logprobs
        (their positions count from num_computed_tokens) and the thinking budget (it may replace
        a sampled token, which the scheduler then appends instead)."""
        for seq in out.seqs:
            scored = result.prompt_logprobs.get(seq.seq_id)
            if scored is not None:
                self._add_prompt_logprobs(seq, scored)
        for i, seq in enumerate(out.sampled_seqs()):
            if seq.params.thinking_budget is not None:
                result.token_ids[i] = self._within_budget(self._requests[seq.request_id], result.token_ids[i])

    def process_outputs(self, out: SchedulerOutput, result: RunnerOutput) -> list[RequestOutput]:
        """After the scheduler's postprocess: embeddings pooled, then each sampled request's
        tokens detokenized and checked against the stopping rules."""
        outputs = []
        for seq, _, _ in out.embedding_rows():
            outputs += self._pool(self._requests[seq.request_id], result.pooled[seq.seq_id])
        now = time.monotonic()
        for seq, tokens, lps in zip(out.sampled_seqs(), result.token_ids, result.logprobs):
            req = self._requests[seq.request_id]
            if req.first_token_time is None:
                req.first_token_time = now
            outputs.append(self._on_tokens(req, tokens, lps))
        return outputs

    @staticmethod
    def _within_budget(req: _Request, tokens: list[int]) -> list[int]:
        """This step's sampled tokens with the thinking budget applied: past it, the closing tag
        takes the place of the next token (a request with a budget is never drafted for: one token)."""
        budget = req.seq.params.thinking_budget
        tokens = list(tokens)
        for j, t in enumerate(tokens):
            if not req.thinking:
                req.thinking = t == budget.open_id
            elif req.thought >= budget.max_tokens and t != budget.close_id:
                req.thinking = False
                return tokens[:j] + [budget.close_id]
            else:
                req.thinking, req.thought = t != budget.close_id, req.thought + 1
        return tokens

    def _pool(self, req: _Request, rows_sum: list[float]) -> list[RequestOutput]:
        """Add one chunk's hidden rows to an embedding; once the whole prompt is in, its mean
        (llama.cpp's mean pooling) ends the request."""
        req.pooled = rows_sum if req.pooled is None else [a + b for a, b in zip(req.pooled, rows_sum)]
        seq = req.seq
        if seq.num_computed_tokens < seq.num_prompt_tokens:
            return []
        req.first_token_time = time.monotonic()
        out = self._finish(seq.request_id, "stop")
        out.embedding = [v / seq.num_prompt_tokens for v in req.pooled]
        return [out]

    def _add_prompt_logprobs(self, seq: Sequence, scored: list[TokenLogprobs]) -> None:
        """scored[j] is position c+j+1; keep each prompt position once (a recompute scores again)."""
        req = self._requests[seq.request_id]
        if not req.prompt_logprobs:
            req.prompt_logprobs.append(None)
        for pos, lp in enumerate(scored, seq.num_computed_tokens + 1):
            if pos == len(req.prompt_logprobs):
                req.prompt_logprobs.append(lp)

    def _on_tokens(self, req: _Request, tokens: list[int], lps: list[TokenLogprobs] | None) -> RequestOutput:
        """This step's tokens of one request (one, or accepted drafts and one more), already in
        seq.token_ids: detokenize and check the stopping rules token by token; tokens after the
        one that ends the request are dropped."""
        seq, params = req.seq, req.seq.params
        reason, matched, text = None, False, ""
        n_out = seq.num_output_tokens - len(tokens)  # output tokens before this step's
        for j, token in enumerate(tokens):
            n_out += 1
            if (token in self.tokenizer.stop_ids and not params.ignore_eos) or token in params.stop_token_ids:
                reason = "stop"
            else:
                piece = req.detok.add(token)
                if req.stops is not None:
                    piece, matched = req.stops.feed(piece)
                    reason = "stop" if matched else None
                text += piece
            if reason is None and (n_out >= seq.max_tokens or seq.num_prompt_tokens + n_out >= self.max_model_len):
                reason = "length"
            if reason is not None:
                if j + 1 < len(tokens):  # drafts accepted past the end: not part of the reply
                    del seq.token_ids[j + 1 - len(tokens):]
                    tokens = tokens[:j + 1]
                    lps = lps[:j + 1] if lps is not None else None
                break
        req.text += text
        if reason is None:
            return self._output(req, tokens, text, None, lps)
        if not matched:  # no stop string can match any more: release held-back text
            text += self._flush(req)
        return self._finish(seq.request_id, reason, new_text=text, new_ids=tokens, logprobs=lps)

    @staticmethod
    def _flush(req: _Request) -> str:
        tail = req.detok.flush()
        if req.stops is not None:
            tail = req.stops.feed(tail)[0] + req.stops.flush()
        req.text += tail
        return tail

    def _finish(self, request_id: str, reason: str, new_text: str = "", new_ids=(), logprobs=None) -> RequestOutput:
        req = self._requests.pop(request_id)
        if reason != "abort" and not req.seq.status.is_finished:
            self.on_finish(req.seq, SequenceStatus.FINISHED_LENGTH if reason == "length"
                        else SequenceStatus.FINISHED_STOPPED)
        return self._output(req, list(new_ids), new_text, reason, logprobs)

    @staticmethod
    def _output(req: _Request, ids: list[int], text: str, reason: str | None, lp) -> RequestOutput:
        seq = req.seq
        return RequestOutput(
            request_id=seq.request_id, new_token_ids=ids, new_text=text,
            output_token_ids=list(seq.output_token_ids), text=req.text, finished=reason is not None,
            finish_reason=reason, num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens, logprobs=lp or None,
            prompt_logprobs=req.prompt_logprobs or None, arrival_time=req.arrival_time,
            first_token_time=req.first_token_time, num_spec_proposed=seq.num_spec_proposed,
            num_spec_accepted=seq.num_spec_accepted)
