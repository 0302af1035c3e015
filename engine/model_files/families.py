"""The dense decoder families Ember's own engine runs, as data: one description per family.

Every family is the Llama block (pre-norm, GQA attention, gated MLP) plus a few switches; the
loader (engine/loaders/gguf_loader.py), the Python forward (engine/models/llama.py) and the C++
stack (engine/kernels/csrc/decoder.cpp) read these switches, so adding a family is one entry
here (and its tensor names, if new, in engine/loaders/weight_names.py). Standard library only: the fit
check asks "does Ember's engine run this file?" without torch.

What the switches mean, as llama.cpp 0.3.36 builds each graph (src/models/*.cpp):
- rope_interleaved: the GGUF stores Q/K rows permuted for interleaved RoPE pairs (llama.cpp's
  NORM RoPE; the converter's `permute`), which the loader undoes; NEOX families store HF order.
- qk_norm: an RMSNorm over each head of q and of k (weights [head_dim]) before RoPE.
- post_norms: an RMSNorm on the attention output and on the MLP output before each residual add
  (Gemma's "sandwich" norms; GGUF post_attention_norm / post_ffw_norm).
- activation: the gate's nonlinearity, "silu" (SwiGLU) or "gelu_tanh" (GeGLU, ggml_gelu).
- embed_scale_sqrt_hidden: embeddings multiplied by sqrt(hidden) (Gemma; in float32).
- local_rope_base: RoPE base of the sliding-window layers where it differs from the file's
  (Gemma 3: 10,000 on local layers, the file's 1,000,000 on global ones; llama.cpp hard-codes
  it, so does this table). Global layers keep the file's position scaling, local ones none.
- Which layers slide is the header's (engine/model_files/meta.py `sliding_layers`).
- no_rope_period: layers with (i + 1) % period == 0 take no RoPE (SmolLM3's NoPE layers).
- attention_scale_by_layers: layer count -> the query scale's divisor rule hidden/heads instead
  of head_dim (Gemma 3 27B's query_pre_attn_scalar, as llama.cpp reads it: by layer count).
- ignores_sliding_window: llama.cpp runs every layer full whatever the header's window says
  (Phi-3's, disabled in llama.cpp's phi3 loader), so Ember does too.
- fused_projections: the file holds q|k|v as one attn_qkv matrix and gate|up as one ffn_up of
  2 * n_ff rows (Phi-3/Phi-4), which are our fused weights as they stand.
- hf_norm_offset: what a Hugging Face checkpoint's norm weights lack of the plain norm's.
  Gemma's RMSNorm computes x * (1 + w) and stores w; its GGUF converter adds the 1, so the
  engine (and a GGUF) need no switch, but the Hugging Face loader adds it and `ember quantize`'s
  writer takes it off (every norm of the family: the layers', q/k's and the final one).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    rope_interleaved: bool
    qk_norm: bool = False
    post_norms: bool = False
    activation: str = "silu"
    embed_scale_sqrt_hidden: bool = False
    local_rope_base: float | None = None
    no_rope_period: int = 0
    attention_scale_by_layers: frozenset[int] = frozenset()
    fused_projections: bool = False
    ignores_sliding_window: bool = False
    hf_norm_offset: float = 0.0


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama", rope_interleaved=True),  # also Llama 3.x (rope_freqs), SmolLM2, Mistral files
    Family("qwen2", rope_interleaved=False),
    Family("qwen3", rope_interleaved=False, qk_norm=True),
    Family("smollm3", rope_interleaved=True, no_rope_period=4),
    Family("gemma3", rope_interleaved=False, qk_norm=True, post_norms=True, activation="gelu_tanh",
           embed_scale_sqrt_hidden=True, local_rope_base=10000.0,
           attention_scale_by_layers=frozenset({62}), hf_norm_offset=1.0),
    # Phi-3, Phi-4 and Phi-4-mini (partial rotary and LongRoPE: the loader and rotary.py);
    # llama.cpp ignores their sliding window, and so does Ember.
    Family("phi3", rope_interleaved=False, fused_projections=True, ignores_sliding_window=True),
)}

# GGUF architectures llama.cpp runs that Ember's engine leaves to it, and why (logged by `auto`).
NOT_YET: dict[str, str] = {
    "qwen3moe": "mixture-of-experts layers are not in Ember's engine yet",
    "gpt-oss": "mixture-of-experts layers and attention sinks are not in Ember's engine yet",
    "qwen35": "hybrid linear-attention layers are not in Ember's engine yet",
    "gemma4": "Gemma 4's layers are not in Ember's engine yet",
}

