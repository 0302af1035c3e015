"""The runner of an embedding model (an encoder: BERT, nomic-bert, EmbeddingGemma...): it makes
no text, so it holds no weights and no KV here. The vectors come from the server's llama.cpp
embeddings context on the same file (engine/server/embeddings.py), which pools as the file says;
the engine refuses any generation on it, and the server says so before that (require_model).
"""
from __future__ import annotations

from pathlib import Path

from engine.config import EngineConfig
from engine.model_files.footprint import default_context
from engine.model_files.meta import read_gguf_meta
from engine.runner import Runner, RunnerOutput
from engine.scheduler_output import SchedulerOutput
from engine.sequence import Sequence


class EmbeddingRunner(Runner):
    """The Runner protocol (engine/runner.py) for a model that only embeds."""

    paged_kv = False
    max_scoring_seqs = None
    prompt_cache = None
    generates = False  # LLMEngine.add_request refuses every request

    def __init__(self, config: EngineConfig) -> None:
        meta = read_gguf_meta(Path(config.model_path))
        self.architecture = meta.architecture
        self.max_model_len = default_context(meta.context_length or 512, config.max_model_len)
        self.vocab_size = 0  # no logits
        # the vectors come from llama.cpp's embeddings context on this file (engine/server/embeddings.py):
        # the file's size is what the memory budget counts for it
        self.weight_bytes = Path(config.model_path).stat().st_size

    def kv_capacity_blocks(self) -> int:
        return 1  # the block manager needs a pool; nothing is ever scheduled into it

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        raise RuntimeError(f"{self.architecture} is an embedding model: it runs no forward for text")

    def release(self, seq: Sequence) -> None:
        pass

    def close(self) -> None:
        pass
