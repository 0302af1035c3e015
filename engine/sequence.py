"""A request as the scheduler sees it: token ids, counters, block table. No torch.

``token_ids`` holds the prompt and every sampled token. ``num_computed_tokens`` counts the
leading tokens whose K/V are in the pool; the tokens after it are what the next step must
compute (a prefill chunk, or the one token sampled last step). Preemption by recompute sets it
back to 0 and keeps ``token_ids``, so the generated tokens are recomputed as part of the prompt.

Speculative decoding adds ``spec_token_ids``: draft tokens that follow ``token_ids`` and that the
next step verifies (engine/speculative/). They are never in ``token_ids`` until accepted, so
nothing is hashed into the prefix cache or counted as output before the target agrees.
"""
from __future__ import annotations

import copy
import itertools
import time
from enum import Enum, auto

from engine.sampling_params import SamplingParams

BACKGROUND_PRIORITY = 1000  # SamplingParams.background: after any priority a request can name


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED_STOPPED = auto()  # EOS, a stop token or a stop string
    FINISHED_LENGTH = auto()  # max_tokens, the context or the KV pool is full
    FINISHED_ABORTED = auto()  # the client went away or cancelled

    @property
    def is_finished(self) -> bool:
        return self not in (SequenceStatus.WAITING, SequenceStatus.RUNNING)


class Sequence:
    # Process-wide ids, like nano-vllm's; pass seq_id to stay deterministic in tests.
    _ids = itertools.count()

    def __init__(self, token_ids: list[int], params: SamplingParams | None = None,
                 request_id: str | None = None, seq_id: int | None = None,
                 arrival_time: float | None = None) -> None:
        if not token_ids:
            raise ValueError("a sequence needs at least one prompt token")
        self.seq_id = next(Sequence._ids) if seq_id is None else seq_id
        self.request_id = f"seq-{self.seq_id}" if request_id is None else request_id
        self.params = params if params is not None else SamplingParams()
        self.token_ids = list(token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.num_computed_tokens = 0  # leading tokens whose K/V are in the pool
        self.num_cached_tokens = 0  # of those, how many came from the prefix cache at admission
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of the full blocks of token_ids
        self.num_hashed_blocks = 0  # leading blocks of block_table already offered to the cache
        self.status = SequenceStatus.WAITING
        # lower runs first; background work after everything an API can ask for (priority <= 10)
        self.priority = BACKGROUND_PRIORITY if self.params.background else self.params.priority
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.max_tokens = self.params.max_tokens  # the scheduler may lower it to fit the pool
        self.num_preemptions = 0
        self.spec_token_ids: list[int] = []  # drafts the next step verifies after token_ids
        self.images: list = []  # the prompt's images (llamacpp_vision.ImageSpan), by position
        self.spec_probs = None  # the drafter's distributions for them ([k, V] tensor) or None: one-hot
        self.num_spec_proposed = 0  # draft tokens verified for this request
        self.num_spec_accepted = 0  # of those, accepted

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, {self.status.name}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={self.block_table})")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def scores_prompt(self) -> bool:
        """Its request asks for the prompt's logprobs (echo): every prompt position needs logits."""
        return self.params.prompt_logprobs is not None

    @property
    def is_scoring_prompt(self) -> bool:
        """It scores its prompt and has not computed all of it: the scheduler runs each such chunk
        in a step of its own, so its scores never depend on the load."""
        return self.scores_prompt and self.num_computed_tokens < self.num_prompt_tokens

    @property
    def is_prefill(self) -> bool:
        """More than one known token still lacks K/V (a prompt, or a recompute after preemption)."""
        return self.num_tokens - self.num_computed_tokens > 1

    @property
    def verifies_by_rejection(self) -> bool:
        """Its drafts came with the drafter's distributions and its request samples: they are
        verified by rejection sampling, not by matching the target's own draws (engine/sampling/verify.py)."""
        return self.spec_probs is not None and not self.params.is_greedy

    def new_token_ids(self, n: int) -> list[int]:
        """The n tokens a step computes: known tokens from num_computed_tokens on, then drafts."""
        c = self.num_computed_tokens
        ids = self.token_ids[c:c + n]
        if len(ids) < n:
            ids += self.spec_token_ids[:n - len(ids)]
        return ids

    def clear_spec(self) -> None:
        self.spec_token_ids = []
        self.spec_probs = None

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def fork(self, seq_id: int | None = None, request_id: str | None = None) -> Sequence:
        """A child with the same tokens and counters; BlockManager.fork shares the blocks."""
        child = copy.copy(self)
        child.seq_id = next(Sequence._ids) if seq_id is None else seq_id
        child.request_id = f"seq-{child.seq_id}" if request_id is None else request_id
        child.token_ids = list(self.token_ids)
        child.block_hashes = list(self.block_hashes)
        child.block_table = []
        child.num_hashed_blocks = 0
        child.spec_token_ids, child.spec_probs = [], None
        return child
