"""The GGUF file's tokenizer, run by llama.cpp itself so that ids match llama.cpp exactly.

A vocab-only llama.cpp model (no weights, a few ms to load) through llama-cpp-python's C API:
`llama_tokenize` for encode, `llama_detokenize` for decode, `llama_token_to_piece` for the
per-token bytes the streaming detokenizer needs. Reimplementing SentencePiece/BPE pre-tokenizers
(a dozen regex flavours keyed by `tokenizer.ggml.pre`) would only be a way to disagree.
"""
from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from pathlib import Path

try:
    import llama_cpp
except ImportError:  # a machine without llama-cpp-python (a GPU box): Tokenizer() says so
    llama_cpp = None

from engine.loaders.token_ids import TokenIds

_backend_lock = threading.Lock()
_backend_ready = False


def _init_backend() -> None:
    """llama_backend_init once per process; keep llama.cpp's load chatter off stderr."""
    global _backend_ready
    with _backend_lock:
        if _backend_ready:
            return
        from llama_cpp import _logger  # installs llama-cpp-python's log callback on import

        if _logger.logger.level == logging.NOTSET:  # nobody chose a level: errors only
            _logger.set_verbose(False)
        llama_cpp.llama_backend_init()
        _backend_ready = True


class Tokenizer(TokenIds):
    """encode/decode identical to llama.cpp on the same GGUF file; cheap for short strings."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no model file at {path}")
        if llama_cpp is None:
            raise RuntimeError("a GGUF file's tokenizer is llama.cpp's, and llama-cpp-python is not installed")
        _init_backend()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
        if not model:
            raise ValueError(f"llama.cpp could not read a vocabulary from {path} "
                             "(not a GGUF file, truncated, or an unsupported tokenizer)")
        self._finalizer = weakref.finalize(self, llama_cpp.llama_model_free, model)
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self._lock = threading.Lock()  # llama.cpp calls release the GIL; one at a time here
        self.path = path
        v = self._vocab
        self.vocab_size: int = llama_cpp.llama_vocab_n_tokens(v)
        self.bos_id: int | None = _opt(llama_cpp.llama_vocab_bos(v))
        self.eos_id: int | None = _opt(llama_cpp.llama_vocab_eos(v))
        self.eot_id: int | None = _opt(llama_cpp.llama_vocab_eot(v))
        self.pad_id: int | None = _opt(llama_cpp.llama_vocab_pad(v))
        self.add_bos: bool = bool(llama_cpp.llama_vocab_get_add_bos(v))
        self.add_eos: bool = bool(llama_cpp.llama_vocab_get_add_eos(v))
        # End-of-generation: llama.cpp's EOG set = EOS, EOT, EOM and end-of-turn tokens it finds
        # by text (<|im_end|>, <|eot_id|>, <|end|>, <end_of_turn>, ...), less what it takes out on
        # purpose: gpt-oss's <|end|> (its EOT) ends a harmony message, not the reply, which goes on
        # to the final channel and ends at <|return|> or <|call|>.
        eog = {t for t in range(self.vocab_size) if llama_cpp.llama_vocab_is_eog(v, t)}
        self.stop_ids: frozenset[int] = frozenset(eog | ({self.eos_id} if self.eos_id is not None else set()))
        self._pieces: list[bytes | None] = [None] * self.vocab_size  # special tokens as text
        self._plain: list[bytes | None] = [None] * self.vocab_size  # special tokens as b""

    @classmethod
    def from_gguf(cls, path: str | Path) -> "Tokenizer":
        return cls(path)

    def close(self) -> None:
        """Frees llama.cpp's vocabulary; later calls raise instead of touching freed memory."""
        with self._lock:
            self._finalizer()

    @property
    def _v(self):
        if not self._finalizer.alive:
            raise ValueError("the tokenizer is closed")
        return self._vocab

    # ---- text -> ids ---------------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        """Token ids of `text`; add_bos None follows the file (BOS/EOS as llama.cpp adds them).

        parse_special=True turns "<|im_start|>" in the text into its control token, as llama.cpp's
        server does for prompts; False tokenizes it as plain characters (user-typed text).
        Lone surrogates (invalid in UTF-8) become "?".
        """
        data = text.encode("utf-8", errors="replace")
        add_special = add_bos is None
        n_max = len(data) + 2  # a token covers at least one byte; + BOS/EOS
        with self._lock:
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self._v, data, len(data), buf, n_max,
                                         add_special, parse_special)
            if n < 0:  # cannot happen with n_max above, but the API allows it
                buf = (llama_cpp.llama_token * -n)()
                n = llama_cpp.llama_tokenize(self._v, data, len(data), buf, -n,
                                             add_special, parse_special)
            if n < 0:
                raise ValueError(f"llama.cpp failed to tokenize a text of {len(data)} bytes")
            ids = buf[:n]
        if add_bos and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        return ids

    # ---- ids -> text ---------------------------------------------------------------------------
    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """llama.cpp's detokenize; control tokens as their text unless skip_special.

        For SentencePiece vocabularies llama.cpp drops the leading space of the first token here;
        the streaming detokenizer (piece by piece, like llama.cpp's server) keeps it.
        """
        ids = self._check(ids)
        if not ids:
            return ""
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        size = max(64, 8 * len(ids))
        with self._lock:
            for _ in range(2):
                out = ctypes.create_string_buffer(size)
                n = llama_cpp.llama_detokenize(self._v, arr, len(ids), out, size,
                                               False, not skip_special)
                if n >= 0:
                    return out.raw[:n].decode("utf-8", errors="replace")
                size = -n
        raise ValueError("llama.cpp failed to detokenize")

    def token_bytes(self, token_id: int, special: bool = True) -> bytes:
        """Raw bytes of one token's piece (a byte-fallback token is one byte, maybe not UTF-8).

        special=False renders control tokens as b"" (skip_special)."""
        cache = self._pieces if special else self._plain
        try:
            piece = cache[token_id]
        except (IndexError, TypeError):
            raise ValueError(f"token id {token_id!r} is outside the vocabulary "
                             f"(0..{self.vocab_size - 1})") from None
        if piece is None:
            if token_id < 0:
                raise ValueError(f"token id {token_id} is negative")
            piece = cache[token_id] = self._piece(token_id, special)
        return piece

    def _piece(self, token_id: int, special: bool) -> bytes:
        size = 64
        with self._lock:
            while True:
                buf = ctypes.create_string_buffer(size)
                n = llama_cpp.llama_token_to_piece(self._v, token_id, buf, size, 0, special)
                if n >= 0:
                    return buf.raw[:n]
                size = -n

    def is_special(self, token_id: int) -> bool:
        self._check([token_id])
        return bool(llama_cpp.llama_vocab_is_control(self._v, token_id))


def _opt(token: int) -> int | None:
    return None if token < 0 else int(token)


def load_tokenizer(path: str | Path):
    """A model's tokenizer: a Hugging Face directory -> HFTokenizer, a GGUF file -> Tokenizer."""
    if Path(path).is_dir():
        from engine.loaders.hf_tokenizer import HFTokenizer

        return HFTokenizer(path)
    return Tokenizer(path)
