"""Tiny random GGUF models that llama.cpp loads, for fast tests of every part of Ember.

`write_tiny_model(path, ...)` writes a complete model: architecture metadata, random weights in
a chosen tensor type, and a real byte-level BPE tokenizer (gpt2 style: the 256 byte tokens, a
few hundred merges learnt from a built-in text, ChatML specials and a ChatML chat template).
llama.cpp (llama-cpp-python) loads the result both with `vocab_only=True` and in full, so it can
serve as the oracle on the same file.

Layout facts the factory follows (gguf-py constants, llama.cpp `convert_hf_to_gguf.py`):
- llama-family files store Q/K rows permuted for interleaved (NORM) RoPE; random weights have no
  "HF order" to preserve, so we simply write random rows: llama.cpp reads them as NORM-RoPE
  weights and our loader must un-permute them to match it. qwen2 files are NEOX, not permuted,
  and carry q/k/v biases.
- `output.weight` is omitted when `tied=True`: the LM head is then `token_embd`.
- Quantized rows need `in_features % 32 == 0` (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0) or `% 256 == 0`
  (K-quants, written as random blocks with sane f16 scales since gguf-py cannot quantize them).
"""
from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter, TokenType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS_ID, IM_START_ID, IM_END_ID = 0, 1, 2
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_TRAIN_TEXT = """\
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun, and the fox runs
into the forest. It is a small model for tests: it has a real tokenizer, a chat template and
random weights. Hello, world! How are you today? I am fine, thank you.
def main():
    for i in range(10):
        print("hello", i)
    return 0
int main(void) { return printf("%d\\n", 42); }
Der schnelle Fuchs springt über den faulen Hund. Le renard rapide saute par-dessus le chien.
El zorro rápido salta sobre el perro perezoso. 素早い茶色の狐が怠け者の犬を飛び越える。
敏捷的棕色狐狸跳过了懒狗。 Быстрая лиса прыгает через ленивую собаку. 🙂🚀✨
"""


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (byte-level BPE token spelling)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@lru_cache(maxsize=4)
def bpe_vocab(num_merges: int = 200) -> tuple[list[str], list[str]]:
    """(tokens, merges): specials, the 256 byte tokens, then one token per learnt merge.

    A plain BPE trainer: words are split GPT-2 style (optional leading space + letters, digits,
    punctuation or whitespace runs), spelt in byte-unicode; the most frequent adjacent pair is
    merged, `num_merges` times (ties broken by the pair itself, so the result is deterministic).
    """
    b2u = bytes_to_unicode()
    words = Counter(re.findall(r" ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+", _TRAIN_TEXT))
    seqs = {w: [b2u[b] for b in w.encode()] for w in words}
    tokens = list(SPECIAL_TOKENS) + [b2u[b] for b in range(256)]
    merges: list[str] = []
    for _ in range(num_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for w, n in words.items():
            s = seqs[w]
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        merged = a + b
        merges.append(f"{a} {b}")
        if merged not in tokens:
            tokens.append(merged)
        for w in words:
            s, out, i = seqs[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return tokens, merges


def random_k_quant_blocks(rng: np.random.Generator, rows: int, cols: int, qtype: QT) -> np.ndarray:
    """Random K-quant bytes [rows, cols/256*type_size] with f16 scales ~0.01 (weights ~ ±0.1).

    Byte offsets of the f16 fields (ggml-common.h): Q4_K/Q5_K put d, dmin first; Q6_K puts d last.
    """
    block, size = GGML_QUANT_SIZES[qtype]
    nb = rows * cols // block
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.5, size=(nb, 1)) * 1e-3).astype(np.float16).view(np.uint8)
    if qtype in (QT.Q4_K, QT.Q5_K):
        raw[:, 0:2] = d
        raw[:, 2:4] = (rng.uniform(0.5, 1.5, size=(nb, 1)) * 1e-3).astype(np.float16).view(np.uint8)
    elif qtype == QT.Q6_K:
        raw[:, size - 2:] = (d.view(np.float16) * 2).view(np.uint8)
    else:
        raise ValueError(f"not a supported K-quant: {qtype.name}")
    return raw.reshape(rows, cols // block * size)


def _encode(rng: np.random.Generator, w: np.ndarray, qtype: QT) -> tuple[np.ndarray, QT | None]:
    """A float32 [out, in] weight in the requested file type (raw_dtype None = numpy dtype)."""
    if qtype == QT.F32:
        return w.astype(np.float32), None
    if qtype == QT.F16:
        return w.astype(np.float16), None
    if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
        return random_k_quant_blocks(rng, w.shape[0], w.shape[1], qtype), qtype
    try:
        return quantize(w, qtype), qtype
    except NotImplementedError:  # a type gguf-py cannot write (e.g. IQ4_NL): random bytes
        block, size = GGML_QUANT_SIZES[qtype]
        return rng.integers(0, 256, size=(w.shape[0], w.shape[1] // block * size), dtype=np.uint8), qtype


def write_tiny_model(path: str | Path, arch: str = "llama", n_layers: int = 2, hidden: int = 64,
                     n_heads: int = 4, n_kv_heads: int = 2, ffn: int = 128, ctx: int = 512,
                     seed: int = 0, qtype: QT = QT.F32, tied: bool = False,
                     rope_theta: float = 10000.0, rms_eps: float = 1e-5, num_merges: int = 200,
                     pre: str = "smollm", rope_scaling: tuple[str, float] | None = None,
                     extra_tokens: int = 0, embd_qtype: QT | None = None,
                     tensor_types: dict[str, QT] | None = None, drop_tensors: tuple[str, ...] = (),
                     metadata: dict[str, int | float] | None = None, rope_freqs: bool | tuple = False) -> Path:
    """Write a random tiny `arch` ("llama" or "qwen2") model with a real BPE tokenizer; return path.

    Weights are N(0, 0.02²)-ish, norms ~1, so logits are well-spread but finite. `qtype` applies to
    the 2-D projection weights (and to token_embd unless `embd_qtype` says otherwise); norms and
    biases stay F32 as in real files. `extra_tokens` pads the vocabulary with plain tokens.
    For bad-input tests: `tensor_types` overrides the type of named tensors, `drop_tensors` leaves
    tensors out, and `metadata` overrides numeric `{arch}.*` keys (e.g. {"block_count": 10**9}).
    `rope_freqs` adds a llama3-style `rope_freqs.weight` (per-frequency divisors in [1, 8]; a
    tuple: those divisors).
    """
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"unsupported arch {arch!r}")
    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, merges = bpe_vocab(num_merges)
    tokens = tokens + [f"<extra_{i}>" for i in range(extra_tokens)]
    vocab = len(tokens)
    hd = hidden // n_heads
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}-{n_layers}x{hidden}")
    meta: dict[str, int | float] = {
        "context_length": ctx, "embedding_length": hidden, "block_count": n_layers,
        "feed_forward_length": ffn, "attention.head_count": n_heads, "attention.head_count_kv": n_kv_heads,
        "rope.dimension_count": hd, "rope.freq_base": rope_theta,
        "attention.layer_norm_rms_epsilon": rms_eps, "vocab_size": vocab} | (metadata or {})
    for key, value in meta.items():
        if isinstance(value, float):
            w.add_float32(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", value) if value < 2**32 else w.add_uint64(f"{arch}.{key}", value)
    w.add_file_type(int(qtype))
    if rope_scaling is not None:
        from gguf import RopeScalingType
        kind, factor = rope_scaling
        w.add_rope_scaling_type(RopeScalingType(kind))
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(ctx)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    types = [TokenType.CONTROL] * len(SPECIAL_TOKENS) + [TokenType.NORMAL] * (vocab - len(SPECIAL_TOKENS))
    w.add_token_types([int(t) for t in types])
    w.add_token_merges(merges)
    w.add_bos_token_id(EOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_pad_token_id(EOS_ID)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)

    def mat(rows: int, cols: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def put(name: str, arr: np.ndarray, t: QT) -> None:
        if name in drop_tensors:
            return
        data, raw = _encode(rng, arr, (tensor_types or {}).get(name, t))
        w.add_tensor(name, data, raw_dtype=raw)

    def vec(n: int, mean: float = 1.0, scale: float = 0.1) -> np.ndarray:
        return (mean + rng.standard_normal(n) * scale).astype(np.float32)

    put("token_embd.weight", mat(vocab, hidden, 0.5), embd_qtype if embd_qtype is not None else qtype)
    for i in range(n_layers):
        p = f"blk.{i}."
        put(p + "attn_norm.weight", vec(hidden), QT.F32)
        put(p + "attn_q.weight", mat(n_heads * hd, hidden, 0.15), qtype)
        put(p + "attn_k.weight", mat(n_kv_heads * hd, hidden, 0.15), qtype)
        put(p + "attn_v.weight", mat(n_kv_heads * hd, hidden, 0.1), qtype)
        if arch == "qwen2":
            put(p + "attn_q.bias", vec(n_heads * hd, 0.0, 0.2), QT.F32)
            put(p + "attn_k.bias", vec(n_kv_heads * hd, 0.0, 0.2), QT.F32)
            put(p + "attn_v.bias", vec(n_kv_heads * hd, 0.0, 0.2), QT.F32)
        put(p + "attn_output.weight", mat(hidden, n_heads * hd, 0.1), qtype)
        put(p + "ffn_norm.weight", vec(hidden), QT.F32)
        put(p + "ffn_gate.weight", mat(ffn, hidden, 0.1), qtype)
        put(p + "ffn_up.weight", mat(ffn, hidden, 0.1), qtype)
        put(p + "ffn_down.weight", mat(hidden, ffn, 0.1), qtype)
    put("output_norm.weight", vec(hidden), QT.F32)
    if rope_freqs:
        divisors = np.array(rope_freqs, np.float32) if isinstance(rope_freqs, tuple) else rng.uniform(1.0, 8.0, size=hd // 2)
        put("rope_freqs.weight", divisors.astype(np.float32), QT.F32)
    if not tied:
        put("output.weight", mat(vocab, hidden, 0.1), qtype)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
