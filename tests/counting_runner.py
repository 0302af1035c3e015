"""A third runner, no model and no torch (CountingRunner), and an LLMEngine built on it: the Runner
contract's own test drives it, and the engine thread's tests use it as a model that loads at once."""
from __future__ import annotations

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.runner import Runner, RunnerOutput, TokenLogprobs
from engine.scheduler_output import SchedulerOutput
from engine.sequence import Sequence

VOCAB = 100


class CountingRunner(Runner):
    """A third runner, no model and no torch: the next token is the last one plus one; a prompt
    position p scores logprob -p."""

    paged_kv = True
    max_scoring_seqs = None
    prompt_cache = None

    def __init__(self, num_blocks: int = 64, max_model_len: int = 256) -> None:
        self.num_blocks, self.max_model_len = num_blocks, max_model_len
        self.released: list[int] = []
        self.closed = False

    def kv_capacity_blocks(self) -> int:
        return self.num_blocks

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        tokens = [[(s.token_ids[-1] + 1) % VOCAB] for s in out.sampled_seqs()]
        scored = {}
        for s, n in zip(out.seqs, out.num_new_tokens):
            if s.params.prompt_logprobs is not None:
                c = s.num_computed_tokens
                scored[s.seq_id] = [TokenLogprobs(s.token_ids[p], -float(p))
                                    for p in range(c + 1, min(c + n + 1, s.num_prompt_tokens))]
        return RunnerOutput(tokens, [None] * len(tokens), scored)

    def release(self, seq: Sequence) -> None:
        self.released.append(seq.seq_id)

    def close(self) -> None:
        self.closed = True


class PieceTokenizer:
    vocab_size = VOCAB
    stop_ids = frozenset()

    def token_bytes(self, token_id: int, special: bool = True) -> bytes:
        return f"<{token_id}>".encode()


def make_engine(runner: CountingRunner | None = None, **kw) -> LLMEngine:
    config = EngineConfig(model_path="-", block_size=4, **kw)
    return LLMEngine(config, runner=runner or CountingRunner(), tokenizer=PieceTokenizer(),
                     chat_template=object())
