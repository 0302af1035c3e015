"""Tiny random GGUF files in the architectures people download, for tests of what Ember reads.

`write_arch_gguf(path, arch)` writes a model that the llama.cpp inside llama-cpp-python loads and
runs: the metadata keys llama.cpp's converter writes for that architecture, tensors named by
gguf-py's tables for it (`MODEL_TENSORS` / `TENSOR_NAMES`) in the shapes llama.cpp's loader
checks, random f32 weights, and a small byte-level BPE tokenizer. It returns the facts it wrote
(`ArchFacts`), so a test can hold a reader against them.

Shapes: ggml lists a tensor's dimensions innermost first; numpy lists them outermost first, so
a ggml {n_embd, n_vocab} matrix is a numpy [n_vocab, n_embd] array, and an expert stack
{n_embd, n_ff, n_expert} is [n_expert, n_ff, n_embd].

What the architectures need beyond llama's layout (llama.cpp 0.3.36's loader):
- qwen3, qwen3moe: per-head RMS norms on q and k (attn_q_norm / attn_k_norm, [head_dim]);
  qwen3moe: a router (ffn_gate_inp) and stacked experts (ffn_{gate,up,down}_exps), sized by
  `expert_feed_forward_length`, `expert_count`, `expert_used_count`.
- qwen2moe: qwen2's attention (biases on q, k and v, no q/k norms) and qwen3moe's experts, plus a
  shared expert: ffn_{gate,up,down}_shexp of `expert_shared_feed_forward_length` rows and its
  gate's row ffn_gate_inp_shexp ([n_embd]: one logit a token, llama.cpp's sigmoid scales the
  shared expert's output by it).
- gemma3: norms after attention and after the FFN too; the sliding window is
  `attention.sliding_window`, and its layer pattern is not in the file: llama.cpp assumes 5
  sliding layers then 1 global (an optional `attention.sliding_window_pattern` overrides it,
  which Google's converted files do not carry), so 6 layers show one of each kind.
- phi3: one fused q|k|v matrix (attn_qkv) and one fused gate|up matrix (ffn_up, 2 * n_ff rows),
  no ffn_gate; the q width must be n_embd.
- smollm3: llama's tensors; llama.cpp itself skips RoPE on every 4th layer (no key for it).
- gpt-oss: no tied head (output.weight required), attention sinks (one per head), biases on the
  attention output, the router and every expert; `attention.sliding_window` is required and
  llama.cpp assumes every other layer slides, starting with layer 0; YaRN RoPE scaling.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES
from gguf import GGMLQuantizationType, RopeScalingType, TokenType
from gguf.quants import quantize

ARCHS: tuple[str, ...] = ("llama", "qwen3", "qwen3moe", "qwen2moe", "gemma3", "phi3", "smollm3", "gpt-oss")
UNKNOWN_ARCH = "ember-unknown-arch"

_ARCH_ENUM = {name: arch for arch, name in MODEL_ARCH_NAMES.items()}

@dataclass(frozen=True)
class Dims:
    """A written model's widths: the stream, heads, the MLP's rows, and a mixture's experts."""
    embd: int
    heads: int
    kv_heads: int
    head_dim: int
    ff: int
    experts: int
    experts_used: int
    expert_ff: int


# Shared tiny shape: 4 query heads of 16 over a 64-wide stream, 2 KV heads (GQA), 4 experts of 32.
TINY = Dims(64, 4, 2, 16, 128, 4, 2, 32)
# Every matrix's rows whole 256-value super-blocks, so llama.cpp's quantizer gives K-quants.
K_QUANT_READY = Dims(256, 4, 2, 64, 512, 16, 4, 256)
_WINDOW = 32


@dataclass(frozen=True)
class ArchFacts:
    """What `write_arch_gguf` put in the file, as a reader should report it."""
    arch: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    context_length: int
    sliding_window: int  # 0 if none
    sliding_layers: tuple[int, ...]  # layer indices that use the window; empty if none


# Per architecture: layers, training context, RoPE base, RMS eps (close to the real models').
_SHAPES: dict[str, tuple[int, int, float, float]] = {
    "llama": (2, 2048, 500000.0, 1e-5),
    "qwen3": (2, 4096, 1000000.0, 1e-6),
    "qwen3moe": (2, 4096, 1000000.0, 1e-6),
    "qwen2moe": (2, 8192, 1000000.0, 1e-6),
    "gemma3": (6, 8192, 1000000.0, 1e-6),
    "phi3": (2, 4096, 10000.0, 1e-5),
    "smollm3": (2, 4096, 2000000.0, 1e-6),
    # 6 layers: 3 sliding, 3 global. With 4 (2 + 2) this llama.cpp loads the file but its first
    # decode fails ("failed to find a memory slot for batch of size 1"); 2, 3 and 6 all run.
    "gpt-oss": (6, 4096, 150000.0, 1e-5),
    UNKNOWN_ARCH: (2, 2048, 10000.0, 1e-5),
}

# ChatML's, plus SentencePiece's three: llama.cpp looks those up by name (and throws if absent)
# when general.name contains "phi3" or "phi-3", as Microsoft's converted files' names do.
_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>", "<s>", "</s>")
# A few merges so the tokenizer is a real BPE one (each merge's parts are tokens made earlier).
_MERGES = ("h e", "l l", "he ll", "hell o", "Ġ t", "Ġt h", "Ġth e", "i n", "Ġ a", "o r",
           "e r", "a n", "Ġ w", "o n", "Ġ s", "r e", "e n", "Ġ hello", "Ġ o")


def _byte_tokens() -> list[str]:
    """GPT-2's byte -> printable character spelling of the 256 byte tokens."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def _tokenizer(w: GGUFWriter, chat_template: str | None, pre: str) -> None:
    """Bytes, merges, then ChatML specials; `<|endoftext|>` is bos and eos (as in Qwen's files)."""
    tokens = _byte_tokens()
    for merge in _MERGES:
        a, b = merge.split(" ")
        assert a in tokens and b in tokens, merge
        tokens.append(a + b)
    eos = len(tokens)
    tokens += _SPECIALS
    types = [TokenType.NORMAL] * (len(tokens) - len(_SPECIALS)) + [TokenType.CONTROL] * len(_SPECIALS)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(_MERGES))
    w.add_bos_token_id(eos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)


def vocab_size() -> int:
    """Number of tokens every written file has."""
    return 256 + len(_MERGES) + len(_SPECIALS)


class _Tensors:
    """Adds tensors by gguf-py kind, refusing a kind the architecture does not have."""

    def __init__(self, w: GGUFWriter, arch: MODEL_ARCH, rng: np.random.Generator, norm_jitter: float,
                 qtype: GGMLQuantizationType | None):
        self.w, self.kinds, self.rng = w, set(MODEL_TENSORS[arch]), rng
        self.norm_jitter, self.qtype = norm_jitter, qtype

    def add(self, kind: MODEL_TENSOR, shape: tuple[int, ...], *, bid: int | None = None,
            suffix: str = "weight", fill: float | None = None) -> None:
        assert kind in self.kinds, f"{kind.name} is not a tensor of this architecture"
        name = TENSOR_NAMES[kind].format(bid=bid) + "." + suffix
        if fill is not None:  # a norm: 1, or 1 + noise so a norm read in the wrong place shows
            data = (fill + self.norm_jitter * self.rng.standard_normal(shape)).astype(np.float32)
        else:
            data = (self.rng.standard_normal(shape) * 0.05).astype(np.float32)
        # as llama.cpp's quantizer: every matrix and expert stack, but not a router (ffn_gate_inp)
        if self.qtype is not None and len(shape) >= 2 and kind != MODEL_TENSOR.FFN_GATE_INP:
            self.w.add_tensor(name, quantize(data, self.qtype), raw_dtype=self.qtype)
        else:
            self.w.add_tensor(name, data)


def write_arch_gguf(path: Path, arch: str, *, chat_template: str | None = None, seed: int = 0,
                    layers: int | None = None, norm_jitter: float = 0.0,
                    qtype: GGMLQuantizationType | None = None, rope_dim: int | None = None,
                    longrope: bool = False, pre: str = "default", dims: Dims = TINY) -> ArchFacts:
    """Write a tiny random `arch` model (one of ARCHS, or UNKNOWN_ARCH) to `path`; return its facts.

    UNKNOWN_ARCH is a llama-shaped file under a name no runner knows (llama.cpp refuses it).
    layers overrides the architecture's layer count; norm_jitter adds noise to the norms (else
    1); qtype stores every matrix and expert stack (not a router) in that block type, quantized by gguf-py; rope_dim: phi3's
    rotary dimensions (Phi-4-mini rotates 3/4 of each head), else all; longrope: phi3's LongRoPE
    as the converter writes it for the 128k models (rope_factors_long/short, an original context
    of a quarter of the context, attn_factor sqrt(1 + ln(scale) / ln(original))); pre: the
    tokenizer's pre-tokenizer name (Qwen's files say "qwen2"); dims: the widths (TINY, or
    K_QUANT_READY for a file llama.cpp's quantizer turns into K-quants).
    """
    if arch not in ARCHS and arch != UNKNOWN_ARCH:
        raise ValueError(f"not an architecture this helper writes: {arch!r}")
    default_layers, ctx, rope_base, eps = _SHAPES[arch]
    layers = layers or default_layers
    layout = _ARCH_ENUM["llama" if arch == UNKNOWN_ARCH else arch]
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), arch)
    t = _Tensors(w, layout, rng, norm_jitter, qtype)
    T = MODEL_TENSOR
    E, H, KV, D, V = dims.embd, dims.heads, dims.kv_heads, dims.head_dim, vocab_size()
    FF, N, EF = dims.ff, dims.experts, dims.expert_ff
    moe = arch in ("qwen3moe", "qwen2moe", "gpt-oss")

    w.add_name(f"tiny-{arch}")
    w.add_context_length(ctx)
    w.add_embedding_length(E)
    w.add_block_count(layers)
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(eps)
    w.add_file_type(0 if qtype is None else {GGMLQuantizationType.Q8_0: 7, GGMLQuantizationType.Q4_0: 2}[qtype])
    if arch == "phi3":
        w.add_rope_dimension_count(rope_dim or D)
        if longrope:
            w.add_rope_scaling_orig_ctx_len(ctx // 4)
            w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(4) / np.log(ctx // 4))))
    if moe:
        w.add_expert_count(N)
        w.add_expert_used_count(dims.experts_used)
        w.add_expert_feed_forward_length(EF)
    if arch == "qwen2moe":  # the shared expert as wide as the dense MLP would be
        w.add_expert_shared_feed_forward_length(FF)
    window, sliding = 0, ()
    if arch == "gemma3":
        window, sliding = _WINDOW, tuple(i for i in range(layers) if i % 6 < 5)
    elif arch == "gpt-oss":
        window, sliding = _WINDOW, tuple(i for i in range(layers) if i % 2 == 0)
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(ctx // 32)
    if window:
        w.add_sliding_window(window)
    _tokenizer(w, chat_template, pre)

    t.add(T.TOKEN_EMBD, (V, E))
    if longrope:  # per-frequency divisors of the rotated pairs, short ones near 1, long ones larger
        half = (rope_dim or D) // 2
        w.add_tensor("rope_factors_short.weight", (1 + 0.3 * rng.random(half)).astype(np.float32))
        w.add_tensor("rope_factors_long.weight", (1 + 8 * rng.random(half)).astype(np.float32))
    for i in range(layers):
        t.add(T.ATTN_NORM, (E,), bid=i, fill=1.0)
        if arch == "phi3":
            t.add(T.ATTN_QKV, (H * D + 2 * KV * D, E), bid=i)
        else:
            t.add(T.ATTN_Q, (H * D, E), bid=i)
            t.add(T.ATTN_K, (KV * D, E), bid=i)
            t.add(T.ATTN_V, (KV * D, E), bid=i)
        if arch == "qwen2moe":
            t.add(T.ATTN_Q, (H * D,), bid=i, suffix="bias")
            t.add(T.ATTN_K, (KV * D,), bid=i, suffix="bias")
            t.add(T.ATTN_V, (KV * D,), bid=i, suffix="bias")
        t.add(T.ATTN_OUT, (E, H * D), bid=i)
        if arch in ("qwen3", "qwen3moe", "gemma3"):
            t.add(T.ATTN_Q_NORM, (D,), bid=i, fill=1.0)
            t.add(T.ATTN_K_NORM, (D,), bid=i, fill=1.0)
        if arch in ("gemma3", "gpt-oss"):
            t.add(T.ATTN_POST_NORM, (E,), bid=i, fill=1.0)
        if arch == "gpt-oss":
            t.add(T.ATTN_SINKS, (H,), bid=i)
            t.add(T.ATTN_OUT, (E,), bid=i, suffix="bias")
        elif arch == "gemma3":  # same file name (ffn_norm), gguf-py's pre-FFN kind for gemma
            t.add(T.FFN_PRE_NORM, (E,), bid=i, fill=1.0)
        else:  # gpt-oss's post_attention_norm is its FFN norm
            t.add(T.FFN_NORM, (E,), bid=i, fill=1.0)
        if moe:
            t.add(T.FFN_GATE_INP, (N, E), bid=i)
            t.add(T.FFN_GATE_EXP, (N, EF, E), bid=i)
            t.add(T.FFN_UP_EXP, (N, EF, E), bid=i)
            t.add(T.FFN_DOWN_EXP, (N, E, EF), bid=i)
            if arch == "qwen2moe":
                t.add(T.FFN_GATE_INP_SHEXP, (E,), bid=i)
                t.add(T.FFN_GATE_SHEXP, (FF, E), bid=i)
                t.add(T.FFN_UP_SHEXP, (FF, E), bid=i)
                t.add(T.FFN_DOWN_SHEXP, (E, FF), bid=i)
            if arch == "gpt-oss":
                t.add(T.FFN_GATE_INP, (N,), bid=i, suffix="bias")
                t.add(T.FFN_GATE_EXP, (N, EF), bid=i, suffix="bias")
                t.add(T.FFN_UP_EXP, (N, EF), bid=i, suffix="bias")
                t.add(T.FFN_DOWN_EXP, (N, E), bid=i, suffix="bias")
        elif arch == "phi3":
            t.add(T.FFN_UP, (2 * FF, E), bid=i)
            t.add(T.FFN_DOWN, (E, FF), bid=i)
        else:
            t.add(T.FFN_GATE, (FF, E), bid=i)
            t.add(T.FFN_UP, (FF, E), bid=i)
            t.add(T.FFN_DOWN, (E, FF), bid=i)
        if arch == "gemma3":
            t.add(T.FFN_POST_NORM, (E,), bid=i, fill=1.0)
    t.add(T.OUTPUT_NORM, (E,), fill=1.0)
    if arch != "gemma3":  # gemma3 ties its head to the embedding, as Google's files do
        t.add(T.OUTPUT, (V, E))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return ArchFacts(arch=arch, num_layers=layers, num_heads=H, num_kv_heads=KV, head_dim=D,
                     context_length=ctx, sliding_window=window, sliding_layers=sliding)
