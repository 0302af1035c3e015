"""A Hugging Face tokenizer directory (tokenizer.json + tokenizer_config.json), with Tokenizer's API.

Encoding is `tokenizers`' own; everything the engine reads besides ids (token bytes, specials,
stops) follows llama.cpp's rules, so that a directory written from a GGUF by
engine/loaders/gguf_vocab.py behaves exactly like the GGUF under engine/loaders/tokenizer.py:
- control tokens = added tokens with special=True; other added tokens (llama.cpp's USER_DEFINED)
  are still matched in text with parse_special=False, as both llama.cpp and `tokenizers` do;
- a token's bytes: byte-level BPE pieces map the GPT-2 byte-to-unicode alphabet back to bytes;
  SentencePiece pieces turn "▁" into a space and <0xAB> into one byte; added tokens are their text;
- decode is the concatenated bytes, then llama.cpp's clean_spaces passes when tokenizer_config
  says clean_up_tokenization_spaces (Llama 3, GPT-2; off for SmolLM2 and Qwen2);
- stop ids = every eos id the configs name + the end-of-turn tokens llama.cpp finds by text.
Ids between the tokenizer's last token and config.json's vocab_size (padding rows of the
embedding) are tokens with no bytes, as llama.cpp's UNUSED ones.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import tokenizers

from engine.loaders.token_ids import TokenIds

# llama.cpp's end-of-generation tokens by text (llama-vocab.cpp, special_eog_ids), and its FIM
# pad/repo/file-separator tokens, which it also counts as end of generation.
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
             "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
             "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
             "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[")
FIM_EOG_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",  # FIM_PAD
                 "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",  # FIM_REP
                 "<|file_sep|>")  # FIM_SEP
# The end-of-turn token, in llama.cpp's order of candidates (special_eot_id).
EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
             "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
             "<end_of_utterance>")


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode inverted: printable bytes stand for themselves, the other 68
    (controls, space, DEL, NBSP, soft hyphen...) were shifted to U+0100.. in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = dict(zip(printable, printable))
    n = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 0x100 + n
            n += 1
    return {chr(c): b for b, c in chars.items()}


def byte_level_bytes(piece: str) -> bytes:
    table = byte_decoder()
    return b"".join(bytes([table[c]]) if c in table else c.encode("utf-8") for c in piece)


def sentencepiece_bytes(piece: str) -> bytes:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    return piece.replace("\u2581", " ").encode("utf-8")


def clean_spaces(text: bytes) -> bytes:
    """llama.cpp's detokenize clean-up (llama-vocab.cpp), byte for byte: " ?", " !", " .", " ,"
    lose their space; a lone " ' " loses both; " 's", " 'm", " 're", " 've" lose theirs."""
    t = bytearray(text)
    n = len(t)
    total = 1 if n else 0  # pass 1
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    n, total, i = total, 1 if total else 0, 1  # pass 2
    while i < n:
        x = t[i]
        if x == 0x27 and i + 1 < n and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    n, total = total, 1 if total else 0  # pass 3
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = t[i + 1]
            if x1 in b"sm" or (x1 in b"rv" and i + 2 < n and t[i + 2] == 0x65):  # 's 'm 're 've
                total -= 1
        t[total] = x
        total += 1
    return bytes(t[:total])


def read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not readable JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def token_text(value) -> str | None:
    """tokenizer_config's bos_token/eos_token: a string or an AddedToken dict {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _ids(value) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


class HFTokenizer(TokenIds):
    """encode/decode over tokenizer.json, same interface and semantics as `Tokenizer`."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {path}")
        self.path = path
        try:
            self._tk = tokenizers.Tokenizer.from_file(str(file))
            self._tk_plain = tokenizers.Tokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises its own Exception type on bad files
            raise ValueError(f"{file}: `tokenizers` cannot read it: {e}") from None
        # parse_special=False: special added tokens are split like text; other added ones match.
        self._tk_plain.encode_special_tokens = True
        spec = read_json(file)
        cfg = read_json(path / "tokenizer_config.json")
        gen = read_json(path / "generation_config.json")
        model_cfg = read_json(path / "config.json")
        model_cfg = {**model_cfg.get("text_config", {}), **model_cfg}

        vocab = self._tk.get_vocab(with_added_tokens=True)  # text -> id
        added = self._tk.get_added_tokens_decoder()  # id -> AddedToken
        self._control = {i for i, t in added.items() if t.special}
        self._user = {i: t.content.encode("utf-8") for i, t in added.items() if not t.special}
        n = max(vocab.values(), default=-1) + 1
        cfg_n = model_cfg.get("vocab_size")
        self.vocab_size: int = max(n, cfg_n if isinstance(cfg_n, int) else 0)
        self._text: list[str | None] = [None] * self.vocab_size
        for text, i in vocab.items():
            self._text[i] = text
        decoder = json.dumps(spec.get("decoder"))
        self._byte_level = "ByteLevel" in decoder
        # SentencePiece decoders drop the space the normalizer put before the first word.
        self._strip_first_space = not self._byte_level and ("Strip" in decoder or (
            "Metaspace" in decoder and '"never"' not in decoder))

        def lookup(text: str | None) -> int | None:
            return vocab.get(text) if text is not None else None

        def first(*candidates) -> int | None:
            return next((c for c in candidates if c is not None and 0 <= c < self.vocab_size), None)

        eos_ids = _ids(gen.get("eos_token_id")) + _ids(model_cfg.get("eos_token_id"))
        self.bos_id: int | None = first(lookup(token_text(cfg.get("bos_token"))),
                                        *_ids(gen.get("bos_token_id")), *_ids(model_cfg.get("bos_token_id")))
        self.eos_id: int | None = first(lookup(token_text(cfg.get("eos_token"))), *eos_ids)
        self.pad_id: int | None = first(lookup(token_text(cfg.get("pad_token"))),
                                        *_ids(gen.get("pad_token_id")), *_ids(model_cfg.get("pad_token_id")))
        self.eot_id: int | None = first(*(lookup(t) for t in EOT_TEXTS if lookup(t) in self._control))
        add_bos = cfg.get("add_bos_token")
        self.add_bos: bool = (bool(add_bos) if isinstance(add_bos, bool)
                              else self.bos_id is not None and _post_processor_adds(spec, self._text[self.bos_id]))
        self.add_eos: bool = bool(cfg.get("add_eos_token", False)) and self.eos_id is not None
        by_text = {lookup(t) for t in EOG_TEXTS + FIM_EOG_TEXTS} & self._control
        self.stop_ids: frozenset[int] = frozenset(
            {i for i in eos_ids if 0 <= i < self.vocab_size} | by_text
            | {i for i in (self.eos_id, self.eot_id) if i is not None})
        self._clean_spaces = cfg.get("clean_up_tokenization_spaces") is True
        self._pieces: list[bytes | None] = [None] * self.vocab_size

    def close(self) -> None:
        """Nothing to free (Rust memory goes with the object); kept for Tokenizer's interface."""

    # ---- text -> ids ---------------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        """Token ids of `text`; add_bos None follows tokenizer_config (add_bos_token/add_eos_token).

        parse_special=False tokenizes "<|im_start|>" as plain characters. Lone surrogates
        (invalid in UTF-8) become "?", as in Tokenizer."""
        text = text.encode("utf-8", errors="replace").decode("utf-8")
        tk = self._tk if parse_special else self._tk_plain
        ids = tk.encode(text, add_special_tokens=False).ids
        if add_bos is None:
            if self.add_bos and self.bos_id is not None:
                ids.insert(0, self.bos_id)
            if self.add_eos and self.eos_id is not None:
                ids.append(self.eos_id)
        elif add_bos and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        return ids

    # ---- ids -> text ---------------------------------------------------------------------------
    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """The tokens' bytes joined; control tokens as their text unless skip_special."""
        pieces = [self.token_bytes(t, special=not skip_special) for t in self._check(ids)]
        if self._strip_first_space and pieces and pieces[0].startswith(b" "):
            pieces[0] = pieces[0][1:]  # llama.cpp: the first token's space only (not after BOS)
        data = b"".join(pieces)
        if self._clean_spaces:
            data = clean_spaces(data)
        return data.decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int, special: bool = True) -> bytes:
        """Raw bytes of one token (a byte-fallback token is one byte, maybe not UTF-8).

        special=False renders control tokens as b"" (skip_special)."""
        if not isinstance(token_id, int) or not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id!r} is outside the vocabulary "
                             f"(0..{self.vocab_size - 1})")
        if token_id in self._control:
            return (self._text[token_id] or "").encode("utf-8") if special else b""
        piece = self._pieces[token_id]
        if piece is None:
            piece = self._pieces[token_id] = self._piece(token_id)
        return piece

    def _piece(self, token_id: int) -> bytes:
        if token_id in self._user:
            return self._user[token_id]
        text = self._text[token_id]
        if text is None:  # a padding row past the tokenizer's own tokens
            return b""
        return byte_level_bytes(text) if self._byte_level else sentencepiece_bytes(text)

    def is_special(self, token_id: int) -> bool:
        self._check([token_id])
        return token_id in self._control


def _post_processor_adds(spec: dict, bos: str | None) -> bool:
    """Without add_bos_token, a TemplateProcessing post-processor that emits BOS decides (Llama 3)."""
    post = spec.get("post_processor") or {}
    steps = post.get("processors", [post]) if isinstance(post, dict) else []
    for step in steps:
        if isinstance(step, dict) and step.get("type") == "TemplateProcessing":
            return any(isinstance(p, dict) and p.get("SpecialToken", {}).get("id") == bos
                       for p in step.get("single", []))
    return False
