"""A sentence-transformers (or plain Hugging Face) BERT folder, read for its conversion to GGUF:
the encoder's config.json and model.safetensors, its WordPiece vocabulary (tokenizer.json, else
vocab.txt) and the modules that follow it (modules.json: Pooling, Normalize).

What llama.cpp cannot run the way the checkpoint does (max pooling, a Dense projection, an
activation other than GELU) is refused here with a message that says so, before anything is
written. bert_gguf.py writes the file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gguf import TokenType

from engine.model_files.errors import ModelFileError

BERT_ARCHITECTURES = ("BertModel", "BertForMaskedLM", "BertForPreTraining")  # heads dropped: the encoder
SPECIAL = {"unk": "[UNK]", "sep": "[SEP]", "pad": "[PAD]", "cls": "[CLS]", "mask": "[MASK]"}
# sentence-transformers' Pooling modes llama.cpp pools by (llama_pooling_type)
POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_lasttoken": "last"}
UNSUPPORTED_POOLING = {"pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "mean over sqrt(length)",
                       "pooling_mode_weightedmean_tokens": "weighted mean"}
CONVERT_ELSEWHERE = "convert it with llama.cpp's convert_hf_to_gguf.py and import the GGUF"


@dataclass(frozen=True)
class BertFolder:
    root: Path  # the folder the user gave
    encoder: Path  # where config.json and model.safetensors are (modules.json's Transformer path)
    config: dict
    tokens: list[str]  # the vocabulary in id order, as the checkpoint spells it ("##ing")
    token_types: list[int]  # gguf.TokenType of each
    special: dict[str, int]  # unk, sep, pad, cls, mask -> id
    pooling: str | None  # "mean" | "cls" | "last"; None: no Pooling module (llama.cpp's default)
    normalize: bool  # a Normalize module follows the pooling

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def weights(self) -> Path:
        return self.encoder / "model.safetensors"

    def source_files(self) -> list[Path]:
        """The files the conversion reads: what decides whether the same model is installed."""
        names = ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "tokenizer_config.json",
                 "special_tokens_map.json")
        out = [self.encoder / n for n in names if (self.encoder / n).is_file()]
        return out + [p for p in (self.root / "modules.json",) if p.is_file()] + self._module_configs()

    def _module_configs(self) -> list[Path]:
        modules = _json(self.root / "modules.json") if (self.root / "modules.json").is_file() else []
        return [p for m in modules if (p := self.root / m.get("path", "") / "config.json").is_file()
                and p != self.encoder / "config.json"]


def is_bert_folder(path: Path) -> bool:
    """A folder whose encoder's config.json says BERT and holds no quantization config (a GPTQ/AWQ
    folder is imported as it is). Never raises: an unreadable folder is for the caller to report."""
    try:
        path = Path(path)
        config = _json(_encoder_dir(path, _modules(path)) / "config.json")
    except (ModelFileError, OSError):
        return False
    return isinstance(config, dict) and config.get("model_type") == "bert" and "quantization_config" not in config


def read_bert_folder(path: Path) -> BertFolder:
    """The folder's encoder, vocabulary and pooling; ModelFileError saying what is missing or
    what llama.cpp cannot run."""
    root = Path(path)
    modules = _modules(root)
    encoder = _encoder_dir(root, modules)
    config = _json(encoder / "config.json")
    if not isinstance(config, dict):
        raise ModelFileError(f"{encoder / 'config.json'}: expected a JSON object")
    _check_encoder(encoder, config)
    try:
        tokens, types, special = _vocabulary(encoder, config)
    except ModelFileError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # a tokenizer.json of another shape
        raise ModelFileError(f"{encoder}: unreadable vocabulary ({type(e).__name__}: {e})") from None
    pooling, normalize = _pooling(root, modules)
    return BertFolder(root=root, encoder=encoder, config=config, tokens=tokens, token_types=types,
                      special=special, pooling=pooling, normalize=normalize)


def _json(path: Path):
    if not path.is_file():
        raise ModelFileError(f"{path}: missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{path}: invalid JSON: {e}") from None


def _modules(root: Path) -> list[dict]:
    """modules.json's entries (sentence-transformers); [] for a plain Hugging Face folder."""
    if not (root / "modules.json").is_file():
        return []
    modules = _json(root / "modules.json")
    if not isinstance(modules, list) or not all(isinstance(m, dict) and isinstance(m.get("type"), str)
                                                for m in modules):
        raise ModelFileError(f"{root / 'modules.json'}: expected a list of modules with a type each")
    return modules


def _encoder_dir(root: Path, modules: list[dict]) -> Path:
    for m in modules:
        if m["type"].endswith(".Transformer"):
            return root / m.get("path", "")
    return root


def _check_encoder(encoder: Path, config: dict) -> None:
    kind = config.get("model_type")
    if kind != "bert":
        raise ModelFileError(f"{encoder}: not a BERT encoder (config.json's model_type is {kind!r}); Ember converts "
                             f"BERT embedding models only: {CONVERT_ELSEWHERE}")
    archs = config.get("architectures") or ["BertModel"]
    if not any(a in BERT_ARCHITECTURES for a in archs):
        raise ModelFileError(f"{encoder}: a {archs[0]}, not a BERT encoder for embeddings ({', '.join(BERT_ARCHITECTURES)})")
    if config.get("hidden_act", "gelu") not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        raise ModelFileError(f"{encoder}: activation {config['hidden_act']!r}: llama.cpp's BERT uses GELU")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ModelFileError(f"{encoder}: position embeddings {config['position_embedding_type']!r}: llama.cpp's "
                             "BERT has absolute ones")
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                           "max_position_embeddings") if not isinstance(config.get(k), int)]
    if missing:
        raise ModelFileError(f"{encoder / 'config.json'}: no {', '.join(missing)}")
    if not (encoder / "model.safetensors").is_file():
        raise ModelFileError(f"{encoder}: no model.safetensors (Ember reads safetensors weights, never a pickled "
                             "pytorch_model.bin)")


def _vocabulary(encoder: Path, config: dict) -> tuple[list[str], list[int], dict[str, int]]:
    """Tokens in id order with their types; ids missing from the vocabulary are `[PADn]`, unused."""
    if (encoder / "tokenizer.json").is_file():
        by_id, control = _tokenizer_json(encoder / "tokenizer.json")
    elif (encoder / "vocab.txt").is_file():
        by_id, control = _vocab_txt(encoder)
    else:
        raise ModelFileError(f"{encoder}: no tokenizer.json or vocab.txt: the vocabulary is missing")
    size = max(int(config.get("vocab_size") or 0), max(by_id, default=-1) + 1)
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(size)]
    types = [TokenType.CONTROL if i in control else TokenType.NORMAL if i in by_id else TokenType.UNUSED
             for i in range(size)]
    ids = {t: i for i, t in by_id.items()}
    special = {role: ids[text] for role, text in _special_texts(encoder).items() if text in ids}
    for role in ("unk", "sep", "cls"):
        if role not in special:
            raise ModelFileError(f"{encoder}: the vocabulary has no {SPECIAL[role]} token")
    return tokens, types, special


def _tokenizer_json(path: Path) -> tuple[dict[int, str], set[int]]:
    tok = _json(path)
    model = tok.get("model") if isinstance(tok, dict) else None
    if not isinstance(model, dict) or model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
        kind = model.get("type") if isinstance(model, dict) else None
        raise ModelFileError(f"{path}: a {kind or 'unknown'} tokenizer, not BERT's WordPiece")
    by_id = {int(i): t for t, i in model["vocab"].items()}
    control = set()
    for added in tok.get("added_tokens") or []:
        by_id[int(added["id"])] = added["content"]
        if added.get("special"):
            control.add(int(added["id"]))
    return by_id, control


def _vocab_txt(encoder: Path) -> tuple[dict[int, str], set[int]]:
    lines = (encoder / "vocab.txt").read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    by_id = dict(enumerate(line.rstrip("\r") for line in lines))
    specials = set(_special_texts(encoder).values())
    return by_id, {i for i, t in by_id.items() if t in specials}


def _special_texts(encoder: Path) -> dict[str, str]:
    """The special tokens' spellings: tokenizer_config.json or special_tokens_map.json, else BERT's."""
    texts = dict(SPECIAL)
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        if (encoder / name).is_file():
            cfg = _json(encoder / name)
            for role in SPECIAL:
                value = cfg.get(f"{role}_token") if isinstance(cfg, dict) else None
                value = value.get("content") if isinstance(value, dict) else value
                if isinstance(value, str):
                    texts[role] = value
    return texts


def _pooling(root: Path, modules: list[dict]) -> tuple[str | None, bool]:
    pooling, normalize = None, False
    for m in modules:
        kind = m["type"].rsplit(".", 1)[-1]
        if kind == "Transformer":
            continue
        if kind == "Normalize":
            normalize = True
        elif kind == "Pooling":
            pooling = _pooling_mode(root / m.get("path", "") / "config.json")
        elif kind == "Dense":
            raise ModelFileError(f"{root}: a Dense module ({m.get('path')}) projects the embeddings; this conversion "
                                 f"does not carry it: {CONVERT_ELSEWHERE}")
        else:
            raise ModelFileError(f"{root}: modules.json has a {m['type']} module that llama.cpp does not run")
    return pooling, normalize


def _pooling_mode(path: Path) -> str:
    cfg = _json(path)
    if not isinstance(cfg, dict):
        raise ModelFileError(f"{path}: expected a JSON object")
    other = [mode for key, mode in UNSUPPORTED_POOLING.items() if cfg.get(key)]
    modes = [mode for key, mode in POOLING_MODES.items() if cfg.get(key)]
    if other or len(modes) != 1:
        said = ", ".join(modes + other) or "none"
        raise ModelFileError(f"{path}: pooling {said}: llama.cpp pools by exactly one of mean, CLS or last token")
    return modes[0]
