"""A GGUF's vocabulary as Hugging Face tokenizer files, so a directory checkpoint tokenizes like the GGUF.

`write_hf_tokenizer(gguf, out_dir)` writes tokenizer.json (a `tokenizers` byte-level BPE over the
file's tokens and merges, or for SentencePiece files, tokenizer.ggml.model "llama", the BPE of
engine/loaders/gguf_spm_vocab.py), tokenizer_config.json and generation_config.json. The oracle is
llama.cpp: its pre-tokenizer regexes are keyed by `tokenizer.ggml.pre` (llama-vocab.cpp); the HF
tokenizer.json of the same models says the same thing in `tokenizers`' terms (SmolLM2/StarCoder:
single digits, then GPT-2's ByteLevel regex; Qwen2 and Llama 3: one Split regex, then a
ByteLevel that only maps bytes). llama.cpp's load-time fix-ups are written out too: tokens whose
text it treats as end-of-turn/FIM markers become special added tokens, and UNUSED tokens (Qwen's
[PAD151665]...) are left out, as in Qwen's own tokenizer.json (config.json's vocab_size covers
them). Qwen's NFC normalizer is left out because llama.cpp does not normalize.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

from engine.loaders.gguf_spm_vocab import spm_tokenizer
from engine.loaders.hf_tokenizer import EOG_TEXTS, EOT_TEXTS, FIM_EOG_TEXTS


class TokenType(IntEnum):
    """tokenizer.ggml.token_type (gguf-py TokenType / llama.cpp llama_token_type)."""
    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


@dataclass(frozen=True)
class PreTokenizer:
    kind: str  # "digits+gpt2" | "split"
    regex: str | None
    clean_spaces: bool  # llama.cpp's clean_spaces = HF's clean_up_tokenization_spaces
    ignore_merges: bool = False


# The HF originals of llama.cpp's regexes (llama.cpp spells (?i:'s|...) as '[sS]|... only because
# std::regex lacks inline flags).
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "smollm": PreTokenizer("digits+gpt2", None, clean_spaces=False),
    "starcoder": PreTokenizer("digits+gpt2", None, clean_spaces=True),
    "gpt-2": PreTokenizer("gpt2", None, clean_spaces=True),
    "qwen2": PreTokenizer("split", _QWEN2, clean_spaces=False),
    "deepseek-r1-qwen": PreTokenizer("split", _QWEN2, clean_spaces=False),
    "llama3": PreTokenizer("split", _LLAMA3, clean_spaces=True, ignore_merges=True),
    "llama-v3": PreTokenizer("split", _LLAMA3, clean_spaces=True, ignore_merges=True),
    "llama-bpe": PreTokenizer("split", _LLAMA3, clean_spaces=True, ignore_merges=True),
}


def _pre_tokenizer(pre: PreTokenizer):
    if pre.kind == "digits+gpt2":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre.kind == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pre.regex), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _control_by_text(tokens: list[str]) -> set[int]:
    """Ids llama.cpp re-types to CONTROL at load because of their text (EOG, EOT, FIM markers)."""
    names = set(EOG_TEXTS) | set(EOT_TEXTS) | set(FIM_EOG_TEXTS) | {
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
        "<|code_prefix|>", "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
        "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>",
        "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
        "<|middle|>"}
    return {i for i, t in enumerate(tokens) if t in names}


def _pre_tokenizer_of(path: Path, meta) -> PreTokenizer | None:
    """The file's pre-tokenizer for byte-level BPE (tokenizer.ggml.model 'gpt2'); None for
    SentencePiece ('llama'), which has none (llama.cpp's SPM splits nothing before merging)."""
    model = meta.get("tokenizer.ggml.model")
    if model == "llama":
        return None
    if model != "gpt2":
        raise ValueError(f"{path}: tokenizer model {model!r} cannot be written as tokenizer.json "
                         "(supported: byte-level BPE 'gpt2' and SentencePiece 'llama')")
    pre_name = meta.get("tokenizer.ggml.pre") or ""
    pre = PRE_TOKENIZERS.get(pre_name)
    if pre is None:
        raise ValueError(f"{path}: pre-tokenizer {pre_name!r} is not supported "
                         f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
    return pre


def check_hf_tokenizer(path: Path, meta) -> None:
    """Raise ValueError now if the file's tokenizer cannot be written as tokenizer.json (say,
    a WordPiece or Unigram one, or an unknown pre-tokenizer), before anything is quantized."""
    _pre_tokenizer_of(path, meta)


def _token_kinds(path: Path, meta) -> tuple[list[str], list[TokenType]]:
    """The tokens and their types as llama.cpp sees them after its load-time fix-ups."""
    tokens = list(meta.get("tokenizer.ggml.tokens") or [])
    types = list(meta.get("tokenizer.ggml.token_type") or [TokenType.NORMAL] * len(tokens))
    if not tokens or len(types) != len(tokens):
        raise ValueError(f"{path}: tokenizer.ggml.tokens/token_type are missing or disagree in length")
    forced = _control_by_text(tokens)
    return tokens, [TokenType.CONTROL if i in forced else TokenType(t) for i, t in enumerate(types)]


def _bpe(path: Path, meta, pre: PreTokenizer, tokens: list[str], kinds: list[TokenType]
         ) -> tokenizers.Tokenizer:
    """The byte-level BPE over the file's tokens and merges."""
    vocab = {t: i for i, t in enumerate(tokens) if kinds[i] is not TokenType.UNUSED}
    pairs = []
    for m in list(meta.get("tokenizer.ggml.merges") or []):
        left, sep, right = m.partition(" ")
        if not sep:
            raise ValueError(f"{path}: merge {m!r} is not two tokens separated by a space")
        pairs.append((left, right))
    tk = tokenizers.Tokenizer(models.BPE(vocab, pairs, ignore_merges=pre.ignore_merges))
    tk.pre_tokenizer = _pre_tokenizer(pre)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    return tk


# llama.cpp's special ids for a SentencePiece file whose metadata names none.
SPM_DEFAULTS = {"tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
                "tokenizer.ggml.unknown_token_id": 0}


def _spm(path: Path, meta, tokens: list[str]) -> tokenizers.Tokenizer:
    """The SentencePiece BPE over every token (llama.cpp's SPM merges into any of them)."""
    scores = list(meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
    if len(scores) != len(tokens):
        raise ValueError(f"{path}: tokenizer.ggml.scores and tokens disagree in length")

    def text(key: str) -> str | None:
        i = meta.get(key, SPM_DEFAULTS.get(key))
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    add_bos = meta.get("tokenizer.ggml.add_bos_token") is not False  # llama.cpp: on for SPM
    return spm_tokenizer({t: i for i, t in enumerate(tokens)}, scores,
                         unk=text("tokenizer.ggml.unknown_token_id"),
                         add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", True)),
                         bos=text("tokenizer.ggml.bos_token_id") if add_bos else None)


def _add_specials(path: Path, tk: tokenizers.Tokenizer, tokens: list[str], kinds: list[TokenType]
                  ) -> list[AddedToken]:
    """Control/user-defined/unknown tokens as added tokens (never split), keeping their ids."""
    added = [AddedToken(tokens[i], special=k is not TokenType.USER_DEFINED, normalized=False)
             for i, k in enumerate(kinds) if k in (TokenType.CONTROL, TokenType.USER_DEFINED,
                                                   TokenType.UNKNOWN)]
    tk.add_tokens(added)  # already in the vocab: they keep their ids
    check = tk.get_vocab(with_added_tokens=True)
    first: dict[str, int] = {}
    for i, t in enumerate(tokens):
        first.setdefault(t, i)
    moved = [t.content for t in added if check.get(t.content) != first[t.content]]
    if moved:
        raise ValueError(f"{path}: added tokens {moved[:5]} are duplicated in tokenizer.ggml.tokens")
    return added


def _configs(meta, pre: PreTokenizer | None, tokens: list[str], added: list[AddedToken],
             ids: dict[str, int]) -> tuple[dict, dict]:
    """tokenizer_config.json and generation_config.json from the file's special token ids."""
    defaults = SPM_DEFAULTS if pre is None else {}

    def text(key: str) -> str | None:
        i = meta.get(key, defaults.get(key))
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    def tid(key: str) -> int | None:
        i = meta.get(key, defaults.get(key))
        return i if isinstance(i, int) and 0 <= i < len(tokens) else None

    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    eos_ids = [i for i in (tid("tokenizer.ggml.eos_token_id"), tid("tokenizer.ggml.eot_token_id"),
                           tid("tokenizer.ggml.eom_token_id")) if i is not None]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        # llama.cpp's default: BOS for SentencePiece and llama3
        "add_bos_token": bool(add_bos) if add_bos is not None else pre is None or pre.ignore_merges,
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token") or False),
        "bos_token": text("tokenizer.ggml.bos_token_id"),
        "eos_token": text("tokenizer.ggml.eos_token_id"),
        "pad_token": text("tokenizer.ggml.padding_token_id"),
        "unk_token": text("tokenizer.ggml.unknown_token_id"),
        "clean_up_tokenization_spaces": pre is not None and pre.clean_spaces,
        "added_tokens_decoder": {str(ids[t.content]): {
            "content": t.content, "special": t.special, "normalized": False, "lstrip": False,
            "rstrip": False, "single_word": False} for t in added},
    }
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str) and template.strip():
        config["chat_template"] = template
    generation = {"bos_token_id": tid("tokenizer.ggml.bos_token_id"),
                  "eos_token_id": list(dict.fromkeys(eos_ids)),
                  "pad_token_id": tid("tokenizer.ggml.padding_token_id")}
    return config, {k: v for k, v in generation.items() if v not in (None, [])}


def build_hf_tokenizer(path: Path, meta) -> tuple[tokenizers.Tokenizer, dict, dict]:
    """(tokenizer.json, tokenizer_config.json, generation_config.json) for a GGUF's metadata."""
    pre = _pre_tokenizer_of(path, meta)
    tokens, kinds = _token_kinds(path, meta)
    tk = _bpe(path, meta, pre, tokens, kinds) if pre else _spm(path, meta, tokens)
    added = _add_specials(path, tk, tokens, kinds)
    config, generation = _configs(meta, pre, tokens, added, tk.get_vocab(with_added_tokens=True))
    return tk, config, generation


def write_hf_tokenizer(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Writes tokenizer.json, tokenizer_config.json and generation_config.json into out_dir."""
    from engine.model_files.gguf_file import GGUFFile

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    f = GGUFFile(gguf_path)
    try:
        tk, config, generation = build_hf_tokenizer(gguf_path, f)
    finally:
        f.close()
    out_dir.mkdir(parents=True, exist_ok=True)
    tk.save(str(out_dir / "tokenizer.json"))
    for name, data in (("tokenizer_config.json", config), ("generation_config.json", generation)):
        (out_dir / name).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n",
                                    encoding="utf-8")
    return out_dir
