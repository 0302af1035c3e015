"""The engine loop: add requests, step, stream deltas. One thread owns an LLMEngine.

``step()`` is schedule → execute (the runner's forward and sampling) → process outputs
(engine/output_processor.py: detokenize, stop checks, finish), for every running request at once
(continuous batching: requests join and leave at any step), as in nano-vllm and vLLM v1.
No torch: the runner (engine/runner.py) hands back plain token ids and logprob records.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Iterable

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.kv_disk.tier import open_disk_tier
from engine.kv_sizing import idle_cache_tokens
from engine.loaders.chat_template import ChatTemplate
from engine.loaders.tokenizer import Tokenizer, load_tokenizer
from engine.output_processor import OutputProcessor
from engine.outputs import EngineStats, RequestOutput
from engine.runner import Runner, RunnerOutput
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.scheduler_output import SchedulerOutput
from engine.sequence import Sequence, SequenceStatus
from engine.speculative.speculator import Speculator, make_speculator


class ContextLengthError(ValueError):
    """The prompt does not fit the context; the server maps it to context_length_exceeded."""


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
        # Full blocks also go to disk and come back from it after a restart (engine/kv_disk/).
        self.disk_tier = open_disk_tier(config, runner) if runner.paged_kv else None
        self.block_manager = BlockManager(runner.kv_capacity_blocks(), config.block_size,
                                          enable_prefix_caching=caching and runner.paged_kv,
                                          max_cached_free=idle_blocks, on_clean=runner.give_back,
                                          window=runner.sliding_window, on_window_out=runner.give_back_window,
                                          disk=self.disk_tier)
        self.prompt_cache = runner.prompt_cache if caching else None
        self.scheduler = Scheduler(config, self.block_manager, self.prompt_cache, runner.max_scoring_seqs)
        # Drafts for the next step's decodes (engine/speculative/); None: plain decoding.
        self.speculator = speculator if speculator is not None else make_speculator(config, runner)
        self.output_processor = OutputProcessor(self.tokenizer, self.max_model_len, self._end)
        self._ids = itertools.count()

    # ---- requests -------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams,
                    request_id: str | None = None, images: list | None = None) -> str:
        """`images`: the prompt's image spans, from `runner.vision.tokenize` (a vision model's runner)."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        if any(not 0 <= t < self.tokenizer.vocab_size for t in ids):
            raise ValueError("the prompt holds token ids outside the vocabulary")
        if len(ids) >= self.max_model_len + params.embed:  # an embedding needs no room for a reply
            raise ContextLengthError(
                f"this model's maximum context length is {self.max_model_len} tokens; the prompt "
                f"has {len(ids)} tokens and leaves no room for a reply")
        if not self.runner.generates:
            raise ValueError("this is an embedding model: it makes embeddings (/v1/embeddings), not text; "
                             "load a chat model to chat")
        if params.embed and not self.runner.pools_embeddings:
            raise ValueError("this runner computes no embeddings")
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self.output_processor:
            raise ValueError(f"request id {request_id!r} is already running")
        if images and self.runner.vision is None:
            raise ValueError("this model cannot see images: it was loaded without a projector (--mmproj)")
        seq = Sequence(ids, params, request_id=request_id)
        seq.images = list(images or [])
        if params.thinking_budget is not None:
            params.speculative = False  # one token a step: the budget replaces at most that one
        self.output_processor.add(seq)
        self.scheduler.add(seq)
        return request_id

    def abort(self, request_id: str) -> None:
        """Free the request's KV at once; its final output comes from the next step()."""
        seq = self.output_processor.abort(request_id)
        if seq is None:
            return
        self.scheduler.abort(request_id)
        self._release(seq)

    def _release(self, seq: Sequence) -> None:
        self.runner.release(seq)
        if self.speculator is not None:
            self.speculator.release(seq)

    def _end(self, seq: Sequence, status: SequenceStatus) -> None:
        """The output processor's finish: a stopping rule ended seq."""
        self.scheduler.finish(seq, status)
        self._release(seq)

    def has_unfinished(self) -> bool:
        return self.output_processor.has_unfinished()

    # ---- the loop -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs = self.output_processor.aborted()
        out = self.scheduler.schedule()
        for seq in (*out.preempted, *out.finished):  # recomputed later, or could not fit even alone
            self._release(seq)
        outputs += self.output_processor.unscheduled(out)
        if not out.seqs:
            return outputs
        result = self._execute(out)
        self.output_processor.before_postprocess(out, result)  # prompt logprobs, thinking budgets
        self.scheduler.postprocess(out, result.token_ids)
        outputs += self.output_processor.process_outputs(out, result)
        if self.speculator is not None:
            self.speculator.after_step(out, result.token_ids, self.scheduler.running)
        return outputs

    def _execute(self, out: SchedulerOutput) -> RunnerOutput:
        """The runner's forward and sampling; the speculator learns what the step cost."""
        started = time.monotonic()
        result = self.runner.execute(out)
        if self.speculator is not None:
            self.speculator.observe_step(out, time.monotonic() - started)
        return result

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
            spec=dataclasses.replace(self.speculator.stats) if self.speculator is not None else None,
            weight_bytes=self.runner.weight_bytes, kv_bytes=self.runner.kv_bytes,
            num_threads=self.runner.num_threads)

    def close(self) -> None:
        """Release the runner (and a draft model): models and KV memory are freed now (idempotent);
        the disk tier writes what it has queued."""
        self.runner.close()
        if self.disk_tier is not None:
            self.disk_tier.close()
        if self.speculator is not None:
            self.speculator.close()
