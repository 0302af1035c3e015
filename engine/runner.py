"""What a runner is to the engine: the one contract every runner implements. No torch.

A runner owns a model and its KV memory (the torch ModelRunner, llama.cpp's LlamaCppRunner; a
draft model or a remote engine next). LLMEngine reads nothing else of it: its context, its KV
capacity for the block manager's admission, an optional prompt cache for the scheduler, one
`execute` per step that runs the scheduled batch and samples, as nano-vllm's runner does, so the
engine loop handles plain Python results and never a tensor, and the optional capabilities
declared below with their defaults (embeddings, sliding windows, giving memory back, profiling).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from engine.scheduler_output import PromptCache, SchedulerOutput
from engine.sequence import Sequence

if TYPE_CHECKING:  # only named: the vision path loads llama.cpp
    from engine.backends.llamacpp_vision import Vision


@dataclass(slots=True)
class TokenLogprobs:
    """The chosen token's log-probability and the `top` most likely alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), best first


@dataclass(slots=True)
class RunnerOutput:
    """One step's results, in `out.sampled_seqs()` order."""

    # the tokens each sampled sequence appends: one, or with d drafts verified the accepted
    # drafts and one more (the target's own token at the first rejection, or a bonus token)
    token_ids: list[list[int]]
    logprobs: list[list[TokenLogprobs] | None]  # per sampled sequence and token, when its request asks
    # seq_id -> logprobs of prompt positions c+1, c+2, ... scored this step (c: the sequence's
    # num_computed_tokens before it), for every scheduled sequence that scores its prompt
    prompt_logprobs: dict[int, list[TokenLogprobs]] = field(default_factory=dict)
    # seq_id -> the sum of the final hidden rows computed this step, for every scheduled embedding
    # sequence (out.embedding_rows()); the engine sums a prompt's chunks and divides by its length
    pooled: dict[int, list[float]] = field(default_factory=dict)


PhaseTimer = Callable[[str, float], None]  # (phase name, seconds), for every timed call


class Runner(Protocol):
    """The contract. A runner subclasses it (`class ModelRunner(Runner)`) and so inherits the
    defaults of the optional capabilities, which say what a runner without them does: the engine,
    the server and the CLI read every member directly and never probe for one."""

    max_model_len: int  # context length in tokens: prompt + reply
    vocab_size: int  # rows of its logits (a draft model must match it: engine/speculative/vocab_check.py)
    # The KV lives in the block manager's blocks (block tables address it), so block-hash prefix
    # caching can hand a sequence cached blocks. A runner whose KV is its own (llama.cpp's cells)
    # says False and may offer a prompt cache instead.
    paged_kv: bool
    # How many sequences that score their prompt may run at once (None: any number); a runner
    # whose scores depend on what shares its batch keeps them apart (llama.cpp: 1).
    max_scoring_seqs: int | None

    # ---- optional capabilities, with their defaults ----
    # False for a model that makes no text (EmbeddingRunner): the engine refuses every request.
    generates: bool = True
    # True for a runner that fills RunnerOutput.pooled (embeddings through the scheduler, batched
    # with the chats); the engine refuses embeddings otherwise.
    pools_embeddings: bool = False
    # The widest window of the model's sliding-window layers (0: none); the block manager reports
    # the blocks they are done with to give_back_window (engine/kv_window.py).
    sliding_window: int = 0
    # A vision model's image path (engine/backends/llamacpp_vision.py's Vision: tokenize a prompt
    # with images, prefill them); None: the model cannot see, and a request with images is refused.
    vision: Vision | None = None
    # What it holds, for the engine's status (Settings shows the loaded model's real figures):
    # its weights' bytes, the bytes reserved for its KV (kv_capacity_blocks blocks; a lazy pool
    # commits them as chats write), and the CPU threads it computes with (None: not known, or a GPU).
    weight_bytes: int | None = None
    kv_bytes: int | None = None
    num_threads: int | None = None
    # A profiling hook the benches set (app/bench/step_profile.py): while set, a runner that times
    # its phases (the torch runner: "forward", "head") reports each one's seconds every step.
    phase_timer: PhaseTimer | None = None
    # What makes its KV blocks reusable by another process (model file, KV type, kernels, RoPE:
    # engine/kv_disk/identity.py), as one string; None: its KV never goes to the disk tier, and
    # read_blocks and write_block are never called.
    kv_identity: str | None = None

    @property
    def prompt_cache(self) -> PromptCache | None:
        """KV outside the block manager that new prompts may start from; None: no such cache."""
        ...

    def kv_capacity_blocks(self) -> int:
        """How many blocks of block_size tokens its KV memory holds (the block manager's pool)."""
        ...

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        """Compute out's new tokens (`seq.new_token_ids(n)`: known tokens, then drafts), then
        sample each sampled sequence (the rows out.num_logits says; with drafts, verify them)
        and score the prompt rows of sequences that ask for prompt logprobs."""
        ...

    def give_back(self, block_ids: list[int], is_clean: Callable[[int], bool]) -> None:
        """The block manager's on_clean: a runner whose pool can return clean blocks' memory to
        the system does so (the torch runner's CPU pool); by default the memory stays."""

    def give_back_window(self, block_ids: list[int], is_out: Callable[[int], bool]) -> None:
        """The block manager's on_window_out: the sliding-window layers' memory of blocks out of
        their window may go back to the system; by default it stays."""

    def read_blocks(self, block_ids: list[int], window_layers: bool = True) -> list:
        """Copies of these blocks' K and V in every layer (not window_layers: only in the layers
        without a sliding window, for blocks out of it), one bytes-like object per block, that
        the disk tier's writer owns from now on (only with a kv_identity)."""
        return []

    def write_block(self, block_id: int, payload) -> bool:
        """Put a block read_blocks copied (in an earlier process, maybe) back into block_id: True
        when it had every layer, False when only those without a window (the block is out of it);
        ValueError, nothing written, for a payload of the wrong size (only with a kv_identity)."""
        return True

    def release(self, seq: Sequence) -> None:
        """seq's KV is no longer needed (finished, aborted, or preempted to be recomputed);
        a finished sequence's per-request state goes with it. A no-op for unknown sequences."""
        ...

    def close(self) -> None:
        """Free the model and its memory now, not at garbage collection (idempotent)."""
        ...
