"""Ways to get next-token logits for a token list: our model (one sequence, its own small KV pool),
llama.cpp through llama-cpp-python (the oracle), and a float64 dense reference written straight
from the GGUF tensors (interleaved RoPE for llama files, so it does not share our un-permute)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize

from engine.layers.attention import AttentionMetadata
from moe_oracle import moe_ffn

BLOCK = 16


def kv_pool(model, num_tokens: int, dtype=torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    cfg = model.config
    nb = -(-num_tokens // BLOCK)
    shape = (nb, BLOCK, cfg.num_kv_heads, cfg.head_dim)
    return [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)) for _ in range(cfg.num_layers)]


def prefill_meta(start: int, end: int, num_blocks: int) -> AttentionMetadata:
    """One sequence whose tokens [start, end) are computed now over a [0, end) context; the
    sequence owns blocks 0..num_blocks-1 in order."""
    return AttentionMetadata(
        slot_mapping=torch.arange(start, end, dtype=torch.long), query_start_loc=[0, end - start],
        seq_lens=[end], block_tables=torch.arange(num_blocks, dtype=torch.long)[None, :], num_decodes=0)


@torch.inference_mode()
def our_logits(model, tokens: list[int], chunk: int | None = None, rows: slice | None = None) -> torch.Tensor:
    """float32 [T, V]: teacher-forced logits of one sequence, prefilled in chunks of `chunk`;
    with `rows` (whole prefill only), the logits of those positions only: the LM head of a large
    vocabulary costs more than the layers, and a test that reads every other position need not
    pay for the rest."""
    assert rows is None or chunk is None, "rows: the whole prefill only"
    T = len(tokens)
    caches = kv_pool(model, T, model.dtype)
    nb = caches[0][0].shape[0]
    ids = torch.tensor(tokens, dtype=torch.long)
    out = []
    step = chunk or T
    for s in range(0, T, step):
        e = min(T, s + step)
        hidden = model(ids[s:e], torch.arange(s, e), caches, prefill_meta(s, e, nb))
        out.append(model.compute_logits(hidden if rows is None else hidden[rows].contiguous()))
    return torch.cat(out)


def decode_meta(pos: int, num_blocks: int) -> AttentionMetadata:
    """One sequence decoding the token at position `pos` (context pos + 1)."""
    return AttentionMetadata(
        slot_mapping=torch.tensor([pos]), query_start_loc=[0, 1], seq_lens=[pos + 1],
        block_tables=torch.arange(num_blocks, dtype=torch.long)[None, :], num_decodes=1,
        decode_seq_lens=torch.tensor([pos + 1]))


@torch.inference_mode()
def our_greedy(model, prompt: list[int], max_new: int) -> list[int]:
    """Greedy continuation: one prefill, then one decode step per token over the paged pool."""
    T = len(prompt) + max_new
    caches = kv_pool(model, T, model.dtype)
    nb = caches[0][0].shape[0]
    hidden = model(torch.tensor(prompt), torch.arange(len(prompt)), caches, prefill_meta(0, len(prompt), nb))
    out = [int(model.compute_logits(hidden[-1:]).argmax())]
    while len(out) < max_new:
        pos = len(prompt) + len(out) - 1
        hidden = model(torch.tensor(out[-1:]), torch.tensor([pos]), caches, decode_meta(pos, nb))
        out.append(int(model.compute_logits(hidden).argmax()))
    return out


def llama_cpp_greedy(llm, prompt: list[int], max_new: int) -> tuple[list[int], list[np.ndarray]]:
    """llama.cpp's greedy continuation and its logits at each step."""
    llm.reset()
    llm.eval(prompt)
    out, logits = [], []
    while True:
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        logits.append(row)
        out.append(int(row.argmax()))
        if len(out) == max_new:
            return out, logits
        llm.eval(out[-1:])


CHAT_PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that reverses a string.",
    "Give me three tips for sleeping better.",
    "Translate 'good morning, how are you?' into German.",
]


def greedy_chat_departures(path, model, max_new: int = 40) -> tuple[list[float], str]:
    """Greedy replies of `model` and of llama.cpp to CHAT_PROMPTS, compared up to llama.cpp's
    EOS: for each reply that departs, llama.cpp's probability gap between its token and ours at
    the first departing step; and a report line per prompt."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, logits_all=True, n_threads=2, verbose=False)
    report, gaps = [], []
    for text in CHAT_PROMPTS:
        chat = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
        prompt = llm.tokenize(chat.encode(), add_bos=False, special=True)
        theirs, logits = llama_cpp_greedy(llm, prompt, max_new)
        ours = our_greedy(model, prompt, max_new)
        end = theirs.index(llm.token_eos()) + 1 if llm.token_eos() in theirs else len(theirs)
        ours, theirs = ours[:end], theirs[:end]
        i = next((j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        if i is None:
            report.append(f"{text[:30]!r}: identical ({len(ours)} tokens)")
            continue
        p = torch.from_numpy(logits[i]).double().softmax(-1)
        gaps.append((p[theirs[i]] - p[ours[i]]).item())
        report.append(f"{text[:30]!r}: departs at step {i}, gap {gaps[-1]:.4f}")
    return gaps, "\n".join(report)


def llama_cpp_model(path, n_ctx: int, f32_kv: bool = True):
    """llama.cpp with every position's logits kept; F32 KV cache so tiny-model checks are tight."""
    import llama_cpp

    kw = dict(type_k=0, type_v=0, flash_attn=False) if f32_kv else {}
    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                           logits_all=True, n_threads=2, verbose=False, **kw)


def llama_cpp_logits(llm, tokens: list[int]) -> np.ndarray:
    """float32 [T, V]: llama.cpp's logits for each position of a fresh sequence."""
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float32)


def llama_cpp_corpus_logits(path) -> dict:
    """llama.cpp's teacher-forced logits on a model's corpus chunks (tests/corpus.py), with its
    default f16 KV cache, on 2 threads: {"chunks": token lists, "logits": [CTX, V] float32 each,
    "system_info": llama.cpp's build line}. The oracle of the fidelity tests (float32, quantized,
    8-bit KV), which share one computation through conftest's `computed_once`."""
    import llama_cpp

    from corpus import CTX, corpus_chunks, corpus_text

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=CTX, n_batch=CTX, n_ubatch=CTX, logits_all=True,
                          n_threads=2, verbose=False)
    chunks = corpus_chunks(llm.tokenize(corpus_text().encode("utf-8"), add_bos=False, special=False))
    return {"chunks": chunks, "logits": [torch.from_numpy(llama_cpp_logits(llm, c)) for c in chunks],
            "system_info": llama_cpp.llama_print_system_info().decode().strip()}


def _rope_ref(x: torch.Tensor, pos: torch.Tensor, base: float, interleaved: bool, rope_dim: int = 0,
             factors: torch.Tensor | None = None, mscale: float = 1.0) -> torch.Tensor:
    """x [T, H, d]. Interleaved pairs (2i, 2i+1) = llama.cpp NORM; else (i, i+n/2) = NEOX, over
    the first n = rope_dim dims (the rest pass through); frequencies divided by `factors`
    (LongRoPE), cos and sin multiplied by `mscale` (ggml's attn_factor)."""
    n = rope_dim or x.shape[-1]
    freq = base ** (-torch.arange(0, n, 2, dtype=torch.float64) / n)
    if factors is not None:
        freq = freq / factors.double()
    theta = pos[:, None].double() * freq
    c, s = (mscale * theta.cos())[:, None, :].to(x.dtype), (mscale * theta.sin())[:, None, :].to(x.dtype)
    x, rest = x[..., :n], x[..., n:]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.cat((torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2), rest), -1)
    a, b = x[..., : n // 2], x[..., n // 2:]
    return torch.cat((a * c - b * s, b * c + a * s, rest), dim=-1)


# How llama.cpp 0.3.36 builds each family's graph (src/models/*.cpp), written out here on its own
# so the oracle shares nothing with Ember's family table: interleaved (NORM) RoPE, per-head q/k
# norms, Gemma's sandwich norms, GELU-tanh, sqrt(d) embedding scale, the local RoPE base of
# Gemma 3's sliding layers (10,000), SmolLM3's RoPE-less every 4th layer and qwen3moe's experts
# (tests/moe_oracle.py).
_INTERLEAVED = {"llama", "smollm3"}
_QK_NORM = {"qwen3", "qwen3moe", "gemma3"}
_GEMMA = {"gemma3"}


@torch.inference_mode()
def reference_logits(path, tokens: list[int], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """[T, V] in `dtype` (float64: the oracle) from a plain dense transformer over gguf-py-dequantized
    tensors. In float32 the same maths shows how much rounding this network itself amplifies."""
    r = GGUFReader(str(path))
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("tokenizer.")}
    arch = f["general.architecture"]

    def t(name):
        for x in r.tensors:
            if x.name == name:
                shape = tuple(int(n) for n in reversed(x.shape.tolist()))
                return torch.from_numpy(np.array(gguf_dequantize(x.data, x.tensor_type)).reshape(shape)).to(dtype)
        return None

    H, KV = f[f"{arch}.attention.head_count"], f[f"{arch}.attention.head_count_kv"]
    eps, base = f[f"{arch}.attention.layer_norm_rms_epsilon"], f.get(f"{arch}.rope.freq_base", 10000.0)
    window = f.get(f"{arch}.attention.sliding_window", 0)
    n_layers, gemma = f[f"{arch}.block_count"], arch in _GEMMA
    head_dim = f.get(f"{arch}.attention.key_length", t("token_embd.weight").shape[1] // H)
    rope_dim = f.get(f"{arch}.rope.dimension_count", 0)
    # LongRoPE (phi3): llama.cpp takes the short factors while its context is within the
    # original one (these oracles run llama.cpp at small contexts), and the attn_factor always
    factors, mscale = t("rope_factors_short.weight"), f.get(f"{arch}.rope.scaling.attn_factor", 1.0)
    norm = lambda x, w: x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w
    ids = torch.tensor(tokens)
    T = len(tokens)
    pos = torch.arange(T)
    x = t("token_embd.weight")[ids]
    if gemma:
        x = x * float(np.float32(np.sqrt(x.shape[-1])))
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)  # masked: key after query
    for i in range(n_layers):
        p = f"blk.{i}."
        slides = gemma and window and i % 6 < 5
        h = norm(x, t(p + "attn_norm.weight"))
        if t(p + "attn_qkv.weight") is not None:  # phi3: one q|k|v matrix
            q, k, v = (h @ t(p + "attn_qkv.weight").T).split([H * head_dim, KV * head_dim, KV * head_dim], -1)
        else:
            q, k, v = (h @ t(p + n + ".weight").T for n in ("attn_q", "attn_k", "attn_v"))
        if t(p + "attn_q.bias") is not None:
            q, k, v = q + t(p + "attn_q.bias"), k + t(p + "attn_k.bias"), v + t(p + "attn_v.bias")
        d = q.shape[-1] // H
        q, k = q.view(T, H, d), k.view(T, KV, d)
        if arch in _QK_NORM:
            q, k = norm(q, t(p + "attn_q_norm.weight")), norm(k, t(p + "attn_k_norm.weight"))
        if not (arch == "smollm3" and (i + 1) % 4 == 0):
            b = 10000.0 if slides else base
            q = _rope_ref(q, pos, b, arch in _INTERLEAVED, rope_dim, factors, mscale)
            k = _rope_ref(k, pos, b, arch in _INTERLEAVED, rope_dim, factors, mscale)
        k, v = k.repeat_interleave(H // KV, dim=1), v.view(T, KV, d).repeat_interleave(H // KV, dim=1)
        mask = causal | (pos[:, None] - pos[None, :] >= window) if slides else causal
        att = torch.einsum("thd,shd->hts", q, k) / d ** 0.5
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        a = torch.einsum("hts,shd->thd", att, v).reshape(T, H * d) @ t(p + "attn_output.weight").T
        x = x + (norm(a, t(p + "post_attention_norm.weight")) if gemma else a)
        h = norm(x, t(p + "ffn_norm.weight"))
        if t(p + "ffn_gate_inp.weight") is not None:  # a mixture of experts
            x = x + moe_ffn(h, t, p, arch, f[f"{arch}.expert_used_count"])
            continue
        if t(p + "ffn_gate.weight") is None:  # phi3: one gate|up matrix, gate first
            g, u = (h @ t(p + "ffn_up.weight").T).chunk(2, -1)
        else:
            g, u = h @ t(p + "ffn_gate.weight").T, h @ t(p + "ffn_up.weight").T
        g = F.gelu(g, approximate="tanh") if gemma else F.silu(g)
        m = (g * u) @ t(p + "ffn_down.weight").T
        x = x + (norm(m, t(p + "post_ffw_norm.weight")) if gemma else m)
    x = norm(x, t("output_norm.weight"))
    head = t("output.weight")
    return x @ (head if head is not None else t("token_embd.weight")).T


# ---- agreement with llama.cpp: bars that hold for llama.cpp's own builds against each other ----
# llama.cpp multiplies Q4_1 weights by activations rounded to 8 bits, and its AVX2 and AVX-512
# kernels round differently: on the bundled model (4 x 511 teacher-forced predictions, same file)
# its two builds give PPL 15.6050 and 15.6407 and agree with each other on top-1 95.35%; of their
# 95 disagreements, 3.2% have a gap above 0.10 and the largest is 0.182. Ember's float32 against
# either build: top-1 95.50%, at most 1.1% of gaps above 0.10, largest 0.169. So disagreements
# must be near-ties: llama.cpp's probability of its own top token exceeds its probability of ours
# by at most NEAR_TIE for all but NEAR_TIE_SHARE of them (one is always allowed: a handful of
# greedy departures is too few for a share), and by NEAR_TIE_MAX at the very most.
PPL_RATIO_TOL = 0.01
MEAN_KL_MAX = 0.01
TOP1_MIN = 0.95
NEAR_TIE = 0.10
NEAR_TIE_SHARE = 0.05
NEAR_TIE_MAX = 0.25


def agreement(ours: torch.Tensor, theirs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-position figures for logits [n, V] predicting `targets` [n] (float64 maths); `theirs`
    is the oracle whose distribution the KL and the gaps are taken under."""
    return agreements({"ours": ours, "theirs": theirs}, [("ours", "theirs")], targets)[("ours", "theirs")]


AGREEMENT_ROWS = 64  # rows per block: [64, V] float64 stays small for a 262k vocabulary


def agreements(logits: dict[str, torch.Tensor], pairs: list[tuple[str, str]],
               targets: torch.Tensor) -> dict[tuple[str, str], dict[str, torch.Tensor]]:
    """`agreement` for several (ours, theirs) pairs over one set of named logits, each source's
    float64 log-softmax made once per block of rows. Every figure is per row, so blocks give
    the same bits as the whole; they only spare gigabytes of float64 temporaries (a 262k
    vocabulary at 1,024 positions is 2 GiB per tensor)."""
    parts: dict[tuple[str, str], list[dict[str, torch.Tensor]]] = {pair: [] for pair in pairs}
    oracles = {t for _, t in pairs}
    for s in range(0, len(targets), AGREEMENT_ROWS):
        rows, tgt = slice(s, s + AGREEMENT_ROWS), targets[s:s + AGREEMENT_ROWS]
        lps = {name: x[rows].double().log_softmax(-1) for name, x in logits.items()}
        ps = {name: lps[name].exp() for name in oracles}
        tops = {name: lp.argmax(-1) for name, lp in lps.items()}
        idx = torch.arange(len(tgt))
        for o, t in pairs:
            lq, lp, p = lps[o], lps[t], ps[t]
            parts[(o, t)].append({
                "nll_ours": -lq[idx, tgt], "nll_theirs": -lp[idx, tgt],
                "kl": (p * (lp - lq)).sum(-1),
                "agree": tops[o] == tops[t],
                "gap": p[idx, tops[t]] - p[idx, tops[o]],  # 0 where they agree
            })
    return {pair: {k: torch.cat([b[k] for b in blocks]) for k in blocks[0]} for pair, blocks in parts.items()}


def summarize(parts: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    s = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    gaps = s["gap"][~s["agree"]]
    return {
        "n": len(s["kl"]),
        "ppl_ours": s["nll_ours"].mean().exp().item(), "ppl_theirs": s["nll_theirs"].mean().exp().item(),
        "ppl_ratio": (s["nll_ours"].mean() - s["nll_theirs"].mean()).exp().item(),
        "kl": s["kl"].mean().item(), "kl_max": s["kl"].max().item(),
        "top1": s["agree"].double().mean().item(), "disagreements": len(gaps),
        "over_near_tie": int((gaps > NEAR_TIE).sum()), "max_gap": gaps.max().item() if len(gaps) else 0.0,
    }


def format_summary(name: str, f: dict[str, float]) -> str:
    return (f"{name}: {f['n']} predictions, PPL {f['ppl_ours']:.4f} vs {f['ppl_theirs']:.4f} "
            f"(ratio {f['ppl_ratio']:.4f}), mean KL {f['kl']:.5f} (max {f['kl_max']:.4f}), "
            f"top-1 {f['top1']:.2%}, {f['disagreements']} disagreements: {f['over_near_tie']} "
            f"with gap > {NEAR_TIE}, max {f['max_gap']:.4f}")


def assert_agrees(f: dict[str, float]) -> None:
    """The fidelity bar (issues 2 and 10): what llama.cpp's own builds meet against each other."""
    assert abs(f["ppl_ratio"] - 1) <= PPL_RATIO_TOL, f
    assert f["kl"] <= MEAN_KL_MAX, f
    assert f["top1"] >= TOP1_MIN, f
    assert near_ties_ok(f["disagreements"], f["over_near_tie"], f["max_gap"]), f


def near_ties_ok(disagreements: int, over_near_tie: int, max_gap: float) -> bool:
    return over_near_tie <= max(1, int(NEAR_TIE_SHARE * disagreements)) and max_gap <= NEAR_TIE_MAX


def assert_departures_are_near_ties(gaps: list[float], report: str) -> None:
    """Greedy replies that depart from llama.cpp's: the gaps at the first departing steps."""
    assert near_ties_ok(len(gaps), sum(g > NEAR_TIE for g in gaps), max(gaps, default=0.0)), report
