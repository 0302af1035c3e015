"""A tiny sentence-transformers BERT folder with random weights, written the way Hugging Face and
sentence-transformers lay one out: config.json, model.safetensors (optionally under BertForMaskedLM's
"bert." prefix with its MLM head, position_ids and pooler, which a conversion drops), a WordPiece
tokenizer.json built and saved by the `tokenizers` library itself, modules.json with a Pooling and
a Normalize module. Seconds to convert and embed: the converter's round trip without the real model.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world", "bread", "oven",
         "stock", "market", "play", "un", "believ", "able", "close", ".", ",", "!", "?", "'"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
POOLING = {"cls": "cls_token", "mean": "mean_tokens", "max": "max_tokens", "mean_sqrt": "mean_sqrt_len_tokens",
           "last": "lasttoken"}  # sentence-transformers' Pooling config keys, pooling_mode_*
HIDDEN, HEADS, LAYERS, FFN, MAX_POS, EXTRA_IDS = 32, 4, 2, 64, 64, 3


def vocabulary() -> list[str]:
    """Specials, a few words, each letter alone and as a continuation ("##a"), "##ing", "##ed", "##ly"."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    return SPECIAL + WORDS + letters + ["##" + c for c in letters] + ["##ing", "##ed", "##ly"]


def write_bert_folder(root: Path, *, seed: int = 0, pooling: str = "mean", prefixed: bool = False,
                      modules: list[dict] | None = None, model_type: str = "bert") -> Path:
    """The folder; `pooling` names the one Pooling mode set ("mean", "cls", "max", ...), `modules`
    replaces modules.json's list. config.json's vocab_size is EXTRA_IDS past the vocabulary (ids a
    tokenizer never makes, as in real checkpoints padded to a multiple)."""
    from safetensors.numpy import save_file

    root.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary()
    n_vocab = len(vocab) + EXTRA_IDS
    config = {"architectures": ["BertForMaskedLM" if prefixed else "BertModel"], "model_type": model_type,
              "hidden_size": HIDDEN, "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
              "intermediate_size": FFN, "max_position_embeddings": MAX_POS, "type_vocab_size": 2,
              "vocab_size": n_vocab, "layer_norm_eps": 1e-12, "hidden_act": "gelu", "pad_token_id": 0}
    (root / "config.json").write_text(json.dumps(config, indent=2))
    tensors = _weights(np.random.default_rng(seed), n_vocab)
    if prefixed:
        tensors = {"bert." + k: v for k, v in tensors.items()}
        tensors["cls.predictions.bias"] = np.zeros(n_vocab, np.float32)
        tensors["cls.predictions.transform.dense.weight"] = np.zeros((HIDDEN, HIDDEN), np.float32)
    save_file(tensors, str(root / "model.safetensors"))
    _write_tokenizer(root, vocab)
    pooling_dir = root / "1_Pooling"
    pooling_dir.mkdir(exist_ok=True)
    (pooling_dir / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": HIDDEN, **{f"pooling_mode_{m}": name == pooling for name, m in POOLING.items()}}))
    if modules is None:
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                   {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (root / "modules.json").write_text(json.dumps(modules, indent=2))
    return root


def _weights(rng: np.random.Generator, n_vocab: int) -> dict[str, np.ndarray]:
    def normal(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    t = {"embeddings.word_embeddings.weight": normal(n_vocab, HIDDEN, scale=0.5),
         "embeddings.position_embeddings.weight": normal(MAX_POS, HIDDEN),
         "embeddings.token_type_embeddings.weight": normal(2, HIDDEN),
         "embeddings.LayerNorm.weight": 1 + normal(HIDDEN, scale=0.1), "embeddings.LayerNorm.bias": normal(HIDDEN),
         "embeddings.position_ids": np.arange(MAX_POS, dtype=np.int64)[None, :],
         "pooler.dense.weight": normal(HIDDEN, HIDDEN), "pooler.dense.bias": normal(HIDDEN)}
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        for name, (rows, cols) in {"attention.self.query": (HIDDEN, HIDDEN), "attention.self.key": (HIDDEN, HIDDEN),
                                   "attention.self.value": (HIDDEN, HIDDEN),
                                   "attention.output.dense": (HIDDEN, HIDDEN), "intermediate.dense": (FFN, HIDDEN),
                                   "output.dense": (HIDDEN, FFN)}.items():
            t[p + name + ".weight"] = normal(rows, cols)
            t[p + name + ".bias"] = normal(rows, scale=0.05)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + norm + ".weight"] = 1 + normal(HIDDEN, scale=0.1)
            t[p + norm + ".bias"] = normal(HIDDEN, scale=0.05)
    return t


def _write_tokenizer(root: Path, vocab: list[str]) -> None:
    """BERT's tokenizer.json, from the `tokenizers` library: lowercasing BertNormalizer, BertPreTokenizer,
    WordPiece, and [CLS] $A [SEP]."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, processors

    ids = {t: i for i, t in enumerate(vocab)}
    tok = Tokenizer(models.WordPiece(ids, unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps(
        {"do_lower_case": True, "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
         "cls_token": "[CLS]", "mask_token": "[MASK]", "tokenizer_class": "BertTokenizer"}))
