"""Ember's torch engine on a CUDA GPU for tools/cuda_check.py, where llama-cpp-python (and so a
GGUF's own tokenizer) is not installed, as on the lent GPU machines."""
from __future__ import annotations


class IdTokenizer:
    """Stands in for a GGUF's tokenizer (llama.cpp's own) where llama-cpp-python is not installed,
    as on the lent GPU machines: the benchmarks feed token ids and ignore EOS."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size, self.bos_id, self.eos_id, self.eot_id = vocab_size, None, None, None
        self.add_bos, self.stop_ids = False, frozenset()

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        return [300 + b % 1000 for b in text.encode()]

    def token_bytes(self, token_id: int, special: bool = True) -> bytes:
        return b"x"

    def is_special(self, token_id: int) -> bool:
        return False


def load_engine_on_cuda(path: str, weights: str, chats: int, prompt_tokens: int):
    """engine.backends.load_engine's steps, with IdTokenizer where llama.cpp's is missing."""
    import importlib.util

    from engine.backends import config_for, create_runner, decide
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    config = EngineConfig(model_path=path, device="cuda", dtype="bfloat16", weights=weights,
                          max_prefill_chunk=prompt_tokens, max_num_seqs=chats, enable_prefix_caching=False)
    decision = decide(config, "torch", "cuda")
    config = config_for(config, decision)
    tokenizer = None
    if importlib.util.find_spec("llama_cpp") is None:
        from gguf import GGUFReader
        tokenizer = IdTokenizer(len(GGUFReader(path).fields["tokenizer.ggml.tokens"].data))
    return LLMEngine(config, runner=create_runner(config, decision), tokenizer=tokenizer)
