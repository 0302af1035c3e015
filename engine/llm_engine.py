"""The engine loop: add requests, step, stream deltas. One thread owns an LLMEngine.

``step()`` is schedule → one forward over the paged KV pool → sample → detokenize → stop
checks, for every running request at once (continuous batching: requests join and leave
at any step).
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from engine.layers.sampler import Sampler
from engine.loaders.chat_template import ChatTemplate
from engine.loaders.tokenizer import Tokenizer
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus


class ContextLengthError(ValueError):
    """The prompt does not fit the context; the server maps it to context_length_exceeded."""


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    new_text: str
    output_token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None
    num_prompt_tokens: int
    num_cached_tokens: int
    logprobs: list | None = None  # the sampler's TokenLogprobs for new tokens, when asked
    prompt_logprobs: list | None = None  # [None, lp(t1|t0), ...] once the prompt is scored
    arrival_time: float = 0.0
    first_token_time: float | None = None


@dataclass(slots=True)
class EngineStats:
    kv_blocks_total: int
    kv_blocks_used: int
    cached_tokens: int
    prefix_hit_rate: float
    num_running: int
    num_waiting: int
    block_size: int
    max_model_len: int


@dataclass(slots=True)
class _Request:
    seq: Sequence
    detok: IncrementalDetokenizer
    stops: StopStringMatcher | None
    generator: torch.Generator | None
    text: str = ""
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    prompt_logprobs: list = field(default_factory=list)


class LLMEngine:
    def __init__(self, config: EngineConfig, runner=None, tokenizer: Tokenizer | None = None,
                 chat_template: ChatTemplate | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer or Tokenizer.from_gguf(config.model_path)
        self.chat_template = chat_template or ChatTemplate.from_gguf(config.model_path)
        if runner is None:
            from engine.model_runner import ModelRunner
            runner = ModelRunner(config)
        self.runner = runner
        self.model_config = getattr(runner, "model_config", None)
        self.max_model_len = runner.max_model_len
        # Block-hash prefix caching needs a runner whose KV the block tables address (torch);
        # a runner with its own prompt cache (llama.cpp's slots) serves prefixes instead.
        block_caching = config.enable_prefix_caching and getattr(runner, "supports_prefix_caching", True)
        self.block_manager = BlockManager(runner.kv_capacity_blocks(), config.block_size,
                                          enable_prefix_caching=block_caching)
        prompt_cache = runner if hasattr(runner, "match_prompt") and config.enable_prefix_caching else None
        self.scheduler = Scheduler(config, self.block_manager, prompt_cache)
        self.sampler = Sampler()
        self._requests: dict[str, _Request] = {}
        self._pending_aborts: list[str] = []
        self._ids = itertools.count()

    # ---- requests -------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams,
                    request_id: str | None = None) -> str:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        if any(not 0 <= t < self.tokenizer.vocab_size for t in ids):
            raise ValueError("the prompt holds token ids outside the vocabulary")
        if len(ids) >= self.max_model_len:
            raise ContextLengthError(
                f"this model's maximum context length is {self.max_model_len} tokens; the prompt "
                f"has {len(ids)} tokens and leaves no room for a reply")
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already running")
        seq = Sequence(ids, params, request_id=request_id)
        gen = None
        if params.seed is not None and not params.is_greedy:
            gen = torch.Generator().manual_seed(params.seed)
        self._requests[request_id] = _Request(
            seq, IncrementalDetokenizer(self.tokenizer),
            StopStringMatcher(params.stop) if params.stop else None, gen)
        self.scheduler.add(seq)
        return request_id

    def abort(self, request_id: str) -> None:
        """Free the request's KV at once; its final output comes from the next step()."""
        req = self._requests.get(request_id)
        if req is None:
            return
        self.scheduler.abort(request_id)
        self.runner.release(req.seq)
        self._pending_aborts.append(request_id)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    # ---- the loop -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs = [self._finish(rid, "abort") for rid in self._pending_aborts if rid in self._requests]
        self._pending_aborts.clear()
        out = self.scheduler.schedule()
        for seq in out.preempted:
            self.runner.release(seq)
        for seq in out.finished:  # could not fit the pool even alone: end it, say why
            req = self._requests[seq.request_id]
            outputs.append(self._finish(seq.request_id, "length", new_text=self._flush(req)))
        if not out.seqs:
            return outputs
        logits = self.runner.execute(out)
        sample_rows, sampled = [], []
        row = 0
        for seq, n, is_sampled in zip(out.seqs, out.num_new_tokens, out.is_sampled):
            if seq.params.prompt_logprobs is not None:
                self._score_prompt(seq, logits[row:row + n], n)
                row += n
                if is_sampled:
                    sample_rows.append(row - 1)
            elif is_sampled:
                sample_rows.append(row)
                row += 1
            if is_sampled:
                sampled.append(seq)
        reqs = [self._requests[s.request_id] for s in sampled]
        result = self.sampler(
            logits[sample_rows], [s.params for s in sampled], [r.generator for r in reqs],
            [s.token_ids for s in sampled], [s.num_prompt_tokens for s in sampled])
        self.scheduler.postprocess(out, result.token_ids)
        now = time.monotonic()
        for i, (seq, req, token) in enumerate(zip(sampled, reqs, result.token_ids)):
            if req.first_token_time is None:
                req.first_token_time = now
            lp = result.logprobs[i] if seq.params.logprobs is not None else None
            outputs.append(self._on_token(req, token, lp))
        return outputs

    def _score_prompt(self, seq: Sequence, logits: torch.Tensor, n: int) -> None:
        """Row j predicts position c+j+1; keep the prompt's own tokens, once each."""
        req = self._requests[seq.request_id]
        if not req.prompt_logprobs:
            req.prompt_logprobs.append(None)
        logp = torch.log_softmax(logits.float(), dim=-1)
        c = seq.num_computed_tokens
        for j in range(n):
            pos = c + j + 1
            if pos < seq.num_prompt_tokens and pos == len(req.prompt_logprobs):
                req.prompt_logprobs.append(self.sampler.token_logprobs(
                    logp[j], seq.token_ids[pos], seq.params.prompt_logprobs))

    def _on_token(self, req: _Request, token: int, lp) -> RequestOutput:
        seq, params = req.seq, req.seq.params
        reason, matched, text = None, False, ""
        if (token in self.tokenizer.stop_ids and not params.ignore_eos) or token in params.stop_token_ids:
            reason = "stop"
        else:
            text = req.detok.add(token)
            if req.stops is not None:
                text, matched = req.stops.feed(text)
                reason = "stop" if matched else None
        if reason is None and (len(seq.output_token_ids) >= seq.max_tokens
                               or seq.num_tokens >= self.max_model_len):
            reason = "length"
        req.text += text
        if reason is None:
            return self._output(req, [token], text, None, lp)
        if not matched:  # no stop string can match any more: release held-back text
            text += self._flush(req)
        return self._finish(seq.request_id, reason, new_text=text, new_ids=[token], logprobs=lp)

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
            status = SequenceStatus.FINISHED_LENGTH if reason == "length" else SequenceStatus.FINISHED_STOPPED
            self.scheduler.finish(req.seq, status)
            self.runner.release(req.seq)
        return self._output(req, list(new_ids), new_text, reason, logprobs)

    def _output(self, req: _Request, ids: list[int], text: str, reason: str | None, lp) -> RequestOutput:
        seq = req.seq
        return RequestOutput(
            request_id=seq.request_id, new_token_ids=ids, new_text=text,
            output_token_ids=list(seq.output_token_ids), text=req.text, finished=reason is not None,
            finish_reason=reason, num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens, logprobs=[lp] if lp is not None else None,
            prompt_logprobs=req.prompt_logprobs or None, arrival_time=req.arrival_time,
            first_token_time=req.first_token_time)

    # ---- conveniences ---------------------------------------------------------------------
    def generate(self, prompts: Iterable[str | list[int]], params: SamplingParams | list[SamplingParams]
                 ) -> list[RequestOutput]:
        prompts = list(prompts)
        plist = params if isinstance(params, list) else [params] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        final: dict[str, RequestOutput] = {}
        while self.has_unfinished():
            for o in self.step():
                if o.finished:
                    final[o.request_id] = o
        return [final[i] for i in ids]

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            kv_blocks_total=bm.num_blocks, kv_blocks_used=bm.num_used_blocks,
            cached_tokens=getattr(self.runner, "num_cached_tokens", bm.num_cached_tokens),
            prefix_hit_rate=bm.prefix_hit_rate,
            num_running=self.scheduler.num_running, num_waiting=self.scheduler.num_waiting,
            block_size=self.config.block_size, max_model_len=self.max_model_len)
