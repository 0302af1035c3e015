"""The engine loop: add requests, step, stream deltas. One thread owns an LLMEngine.

``step()`` is schedule → the runner's forward and sampling → detokenize → stop checks, for
every running request at once (continuous batching: requests join and leave at any step).
No torch: the runner (engine/runner.py) hands back plain token ids and logprob records.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from engine.kv_sizing import idle_cache_tokens
from engine.loaders.chat_template import ChatTemplate
from engine.loaders.tokenizer import Tokenizer, load_tokenizer
from engine.outputs import EngineStats, RequestOutput
from engine.runner import Runner, TokenLogprobs
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus
from engine.speculative.speculator import Speculator, make_speculator


class ContextLengthError(ValueError):
    """The prompt does not fit the context; the server maps it to context_length_exceeded."""


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


class LLMEngine:
    def __init__(self, config: EngineConfig, runner: Runner | None = None, tokenizer: Tokenizer | None = None,
                 chat_template: ChatTemplate | None = None, speculator: Speculator | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer or load_tokenizer(config.model_path)
        self.chat_template = chat_template or ChatTemplate.from_model(config.model_path, config.chat_template)
        if runner is None:
            from engine.model_runner import ModelRunner
            runner = ModelRunner(config)
        self.runner: Runner = runner
        self.max_model_len = runner.max_model_len
        # Block-hash prefix caching needs a runner whose KV the block tables address (torch);
        # a runner with its own prompt cache (llama.cpp's slots) serves prefixes instead.
        caching = config.enable_prefix_caching
        # Blocks that turn clean go back to a runner that can return their memory (give_back).
        idle_blocks = idle_cache_tokens(config, runner.max_model_len) // config.block_size
        self.block_manager = BlockManager(runner.kv_capacity_blocks(), config.block_size,
                                          enable_prefix_caching=caching and runner.paged_kv,
                                          max_cached_free=idle_blocks, on_clean=getattr(runner, "give_back", None),
                                          window=getattr(runner, "sliding_window", 0),
                                          on_window_out=getattr(runner, "give_back_window", None))
        self.prompt_cache = runner.prompt_cache if caching else None
        self.scheduler = Scheduler(config, self.block_manager, self.prompt_cache, runner.max_scoring_seqs)
        # Drafts for the next step's decodes (engine/speculative/); None: plain decoding.
        self.speculator = speculator if speculator is not None else make_speculator(config, runner)
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
        if len(ids) >= self.max_model_len + params.embed:  # an embedding needs no room for a reply
            raise ContextLengthError(
                f"this model's maximum context length is {self.max_model_len} tokens; the prompt "
                f"has {len(ids)} tokens and leaves no room for a reply")
        if not getattr(self.runner, "generates", True):
            raise ValueError("this is an embedding model: it makes embeddings (/v1/embeddings), not text; "
                             "load a chat model to chat")
        if params.embed and not getattr(self.runner, "pools_embeddings", False):
            raise ValueError("this runner computes no embeddings")
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already running")
        seq = Sequence(ids, params, request_id=request_id)
        if params.thinking_budget is not None:
            params.speculative = False  # one token a step: the budget replaces at most that one
        self._requests[request_id] = _Request(
            seq, IncrementalDetokenizer(self.tokenizer, skip_special=not params.render_special),
            StopStringMatcher(params.stop) if params.stop else None,
            thinking=params.thinking_budget is not None and params.thinking_budget.starts_inside)
        self.scheduler.add(seq)
        return request_id

    def abort(self, request_id: str) -> None:
        """Free the request's KV at once; its final output comes from the next step()."""
        req = self._requests.get(request_id)
        if req is None:
            return
        self.scheduler.abort(request_id)
        self._release(req.seq)
        self._pending_aborts.append(request_id)

    def _release(self, seq: Sequence) -> None:
        self.runner.release(seq)
        if self.speculator is not None:
            self.speculator.release(seq)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    # ---- the loop -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs = [self._finish(rid, "abort") for rid in self._pending_aborts if rid in self._requests]
        self._pending_aborts.clear()
        out = self.scheduler.schedule()
        for seq in out.preempted:
            self._release(seq)
            self._requests[seq.request_id].pooled = None  # recomputed from its first token
        for seq in out.finished:  # could not fit the pool even alone: end it, say why
            self._release(seq)
            req = self._requests[seq.request_id]
            outputs.append(self._finish(seq.request_id, "length", new_text=self._flush(req)))
        if not out.seqs:
            return outputs
        started = time.monotonic()
        result = self.runner.execute(out)
        if self.speculator is not None:
            self.speculator.observe_step(out, time.monotonic() - started)
        for seq in out.seqs:  # before postprocess: positions count from num_computed_tokens
            scored = result.prompt_logprobs.get(seq.seq_id)
            if scored is not None:
                self._add_prompt_logprobs(seq, scored)
        sampled = out.sampled_seqs()
        for i, seq in enumerate(sampled):
            if seq.params.thinking_budget is not None:
                result.token_ids[i] = self._within_budget(self._requests[seq.request_id], result.token_ids[i])
        self.scheduler.postprocess(out, result.token_ids)
        for seq, _, _ in out.embedding_rows():
            outputs += self._pool(self._requests[seq.request_id], result.pooled[seq.seq_id])
        now = time.monotonic()
        for seq, tokens, lps in zip(sampled, result.token_ids, result.logprobs):
            req = self._requests[seq.request_id]
            if req.first_token_time is None:
                req.first_token_time = now
            outputs.append(self._on_tokens(req, tokens, lps))
        if self.speculator is not None:
            self.speculator.after_step(out, result.token_ids, self.scheduler.running)
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
            status = SequenceStatus.FINISHED_LENGTH if reason == "length" else SequenceStatus.FINISHED_STOPPED
            self.scheduler.finish(req.seq, status)
            self._release(req.seq)
        return self._output(req, list(new_ids), new_text, reason, logprobs)

    def _output(self, req: _Request, ids: list[int], text: str, reason: str | None, lp) -> RequestOutput:
        seq = req.seq
        return RequestOutput(
            request_id=seq.request_id, new_token_ids=ids, new_text=text,
            output_token_ids=list(seq.output_token_ids), text=req.text, finished=reason is not None,
            finish_reason=reason, num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens, logprobs=lp or None,
            prompt_logprobs=req.prompt_logprobs or None, arrival_time=req.arrival_time,
            first_token_time=req.first_token_time, num_spec_proposed=seq.num_spec_proposed,
            num_spec_accepted=seq.num_spec_accepted)

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
        bm, pc = self.block_manager, self.prompt_cache
        return EngineStats(
            kv_blocks_total=bm.num_blocks, kv_blocks_used=bm.num_used_blocks,
            cached_tokens=pc.num_cached_tokens if pc is not None else bm.num_cached_tokens,
            prefix_hit_rate=bm.prefix_hit_rate,
            num_running=self.scheduler.num_running, num_waiting=self.scheduler.num_waiting,
            block_size=self.config.block_size, max_model_len=self.max_model_len,
            spec=dataclasses.replace(self.speculator.stats) if self.speculator is not None else None)

    def close(self) -> None:
        """Release the runner (and a draft model): models and KV memory are freed now (idempotent)."""
        self.runner.close()
        if self.speculator is not None:
            self.speculator.close()
