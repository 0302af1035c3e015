"""Whether a draft model may draft for a target: the same tokens under the same ids.

llama.cpp's rule (common/speculative.cpp): same tokenizer type, same BOS/EOS ids, vocabulary
sizes at most 128 apart (padding rows), and identical token text for every id from 5 up to the
smaller size. Read from the GGUF headers, no weights, no torch.
"""
from __future__ import annotations

from pathlib import Path

from engine.model_files.gguf_file import GGUFFile

MAX_VOCAB_DIFFERENCE = 128
CHECK_FROM_TOKEN = 5


class DraftVocabError(ValueError):
    """The draft's vocabulary is not the target's: its tokens would mean other text."""


def check_draft_vocab(target: str | Path, draft: str | Path) -> None:
    with GGUFFile(target) as t, GGUFFile(draft) as d:
        for key in ("tokenizer.ggml.model", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
            if t.get(key) != d.get(key):
                raise DraftVocabError(f"draft model {Path(draft).name}: {key} is {d.get(key)!r}, the target's "
                                      f"is {t.get(key)!r}")
        tt, dt = t.get("tokenizer.ggml.tokens") or [], d.get("tokenizer.ggml.tokens") or []
        if abs(len(tt) - len(dt)) > MAX_VOCAB_DIFFERENCE:
            raise DraftVocabError(f"draft model {Path(draft).name}: {len(dt)} tokens, the target has {len(tt)} "
                                  f"(at most {MAX_VOCAB_DIFFERENCE} apart)")
        for i in range(CHECK_FROM_TOKEN, min(len(tt), len(dt))):
            if tt[i] != dt[i]:
                raise DraftVocabError(f"draft model {Path(draft).name}: token {i} is {dt[i]!r}, the target's "
                                      f"is {tt[i]!r}")
