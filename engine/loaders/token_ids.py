"""What both tokenizers (llama.cpp's for GGUF, tokenizers' for a Hugging Face folder) share once
they know their vocabulary size and each token's bytes."""
from __future__ import annotations

from pathlib import Path


class TokenIds:
    path: Path
    vocab_size: int

    def token_bytes(self, token_id: int, special: bool = True) -> bytes:  # pragma: no cover - interface
        raise NotImplementedError

    def id_to_piece(self, token_id: int) -> str:
        """The token as text for display (logprobs, debugging); invalid UTF-8 shows as U+FFFD."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def _check(self, ids) -> list[int]:
        ids = [int(t) for t in ids]
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")
        return ids

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, vocab_size={self.vocab_size})"
