"""The decoder families Ember's own engine runs, as data: one description per family, and
the only table keyed by family (ModelConfig holds its family's description; nothing else keeps
a list of families or copies a switch).

Every family is the Llama block (pre-norm, GQA attention, gated MLP) plus a few switches; a
mixture-of-experts family's MLP is its experts, routed as its `Routing` says. A new
family is one entry here (and its tensor names, if new, in engine/loaders/weight_names.py). A new
switch touches:
- this file: the field, its meaning below, and the entries that set it;
- one that changes a layer's arithmetic (a norm, the activation): engine/models/llama.py, the
  Python forward, and the native stack, which gets the switches as one struct by name:
  engine/layers/decoder_stack.py `stack_switches` and engine/kernels/csrc/decoder.cpp
  `Switches`, whose contract changes, so the ABI number goes up (engine/kernel_library.py and
  csrc/qlinear.cpp's abi());
- one that changes which layers do what (windows, RoPE per layer): engine/loaders/gguf_config.py
  `layer_fields`, into ModelConfig's per-layer tuples, which both forwards already read;
- one that adds weights: their names (engine/loaders/weight_names.py) and the lists that expect
  them (engine/loaders/gguf_loader.py expected_tensors, engine/quant/source.py norm_modules,
  decoder_stack.py's norms);
- one a Hugging Face config.json states: engine/loaders/hf_checkpoint.py reads it and
  engine/quant/hf_config.py writes it.
Standard library only: the fit check asks "does Ember's engine run this file?" without torch.

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
- swa_period: llama.cpp's sliding-window period where the header has no
  {arch}.attention.sliding_window_pattern: layer i slides when i % period < period - 1
  (llama.cpp's set_swa_pattern; Gemma 3: 5 windowed layers, then a global one). Which layers
  slide is the header's (engine/model_files/meta.py `sliding_layers`); a Hugging Face config's
  window is read only for families with a period (Qwen2's configs carry an unused one).
- no_rope_period: layers with (i + 1) % period == 0 take no RoPE (SmolLM3's NoPE layers).
- attention_scale_by_layers: layer count -> the query scale's divisor rule hidden/heads instead
  of head_dim (Gemma 3 27B's query_pre_attn_scalar, as llama.cpp reads it: by layer count).
- ignores_sliding_window: llama.cpp runs every layer full whatever the header's window says
  (Phi-3's, disabled in llama.cpp's phi3 loader), so Ember does too.
- fused_projections: the file holds q|k|v as one attn_qkv matrix and gate|up as one ffn_up of
  2 * n_ff rows (Phi-3/Phi-4), which are our fused weights as they stand.

- moe: the family's FFN is a mixture of experts, routed as its Routing says (below); the counts
  and widths are the file's ({arch}.expert_count, expert_used_count, expert_feed_forward_length,
  read by engine/loaders/gguf_config.py), the layer is engine/layers/moe.py, and in the native
  stack engine/kernels/csrc/moe.cpp (DecoderStack.add_moe takes the routing's fields).

How a mixture of experts routes (llama.cpp's build_moe_ffn, as the family's graph calls it):
- gating: the scores the router's logits give every expert; "softmax" over all of them.
- norm_top_k: the top k scores divided by their sum before they weigh the experts' outputs
  (qwen3moe: llama.cpp's graph always does, whatever norm_topk_prob the checkpoint had;
  OLMoE and Qwen2-MoE: not).
- shared_expert: a dense gated MLP every token also takes, its output scaled by
  sigmoid(x . g) and added to the routed experts' sum (Qwen2-MoE's ffn_{gate,up,down}_shexp and
  its gate row ffn_gate_inp_shexp; its width is {arch}.expert_shared_feed_forward_length, else
  the file's feed_forward_length, as llama.cpp reads it).

How the family's Hugging Face checkpoints say it (engine/loaders/hf_checkpoint.py reads them,
engine/quant/hf_config.py and writer.py write them):
- hf_model_types: config.json model_types that are this family; the first is the one
  `ember quantize` writes, with hf_class as its "architectures" (none: it refuses the family).
- hf_attention_bias: whether q/k/v carry biases when config.json has no attention_bias key, and
  None for the families whose config.json states it (written by `ember quantize`; Qwen2's
  always carry biases, Phi-3's never, and neither config has the key).
- hf_fused: our fused weight -> the one module the checkpoints store it as (Phi3ForCausalLM's
  qkv_proj and gate_up_proj), rows in weight_names.FUSED's order; elsewhere FUSED's parts.
- hf_norm_renames: our per-layer norm -> its module where the checkpoints name it otherwise
  than weight_names.NORMS: Gemma's post_attention_layernorm is the norm on the attention
  OUTPUT (our attn_output_norm); its FFN input norm is pre_feedforward_layernorm.
- hf_norm_offset: what a Hugging Face checkpoint's norm weights lack of the plain norm's.
  Gemma's RMSNorm computes x * (1 + w) and stores w; its GGUF converter adds the 1, so the
  engine (and a GGUF) need no switch, but the Hugging Face loader adds it and `ember quantize`'s
  writer takes it off (every norm of the family: the layers', q/k's and the final one).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Routing:
    """How a mixture-of-experts family picks and weighs its experts (meanings above)."""
    gating: str = "softmax"
    norm_top_k: bool = True
    shared_expert: bool = False


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
    swa_period: int = 0
    moe: Routing | None = None
    hf_model_types: tuple[str, ...] = ()
    hf_class: str = ""
    hf_attention_bias: bool | None = None
    hf_fused: tuple[tuple[str, str], ...] = ()
    hf_norm_renames: tuple[tuple[str, str], ...] = ()
    hf_norm_offset: float = 0.0


FAMILIES: dict[str, Family] = {f.name: f for f in (
    # also Llama 3.x (rope_freqs), SmolLM2, Mistral files
    Family("llama", rope_interleaved=True, hf_model_types=("llama", "mistral"), hf_class="LlamaForCausalLM"),
    Family("qwen2", rope_interleaved=False, hf_model_types=("qwen2",), hf_class="Qwen2ForCausalLM",
           hf_attention_bias=True),
    Family("qwen3", rope_interleaved=False, qk_norm=True, hf_model_types=("qwen3",), hf_class="Qwen3ForCausalLM"),
    # Qwen3-30B-A3B, Qwen3-Coder-30B-A3B: every layer's FFN is 128 experts, 8 taken per token
    Family("qwen3moe", rope_interleaved=False, qk_norm=True, moe=Routing(norm_top_k=True)),
    # Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B: 60 or 64 experts (4 or 8 taken) and a shared expert
    Family("qwen2moe", rope_interleaved=False, moe=Routing(norm_top_k=False, shared_expert=True)),
    Family("smollm3", rope_interleaved=True, no_rope_period=4, hf_model_types=("smollm3",),
           hf_class="SmolLM3ForCausalLM"),
    Family("gemma3", rope_interleaved=False, qk_norm=True, post_norms=True, activation="gelu_tanh",
           embed_scale_sqrt_hidden=True, local_rope_base=10000.0, swa_period=6,
           attention_scale_by_layers=frozenset({62}), hf_model_types=("gemma3_text",),
           hf_class="Gemma3ForCausalLM", hf_norm_offset=1.0, hf_norm_renames=(
               ("post_attention_layernorm", "pre_feedforward_layernorm"),
               ("attn_output_norm", "post_attention_layernorm"), ("mlp_output_norm", "post_feedforward_layernorm"))),
    # Phi-3, Phi-4 and Phi-4-mini (partial rotary and LongRoPE: the loader and rotary.py);
    # llama.cpp ignores their sliding window, and so does Ember.
    Family("phi3", rope_interleaved=False, fused_projections=True, ignores_sliding_window=True,
           hf_model_types=("phi3",), hf_class="Phi3ForCausalLM", hf_attention_bias=False,
           hf_fused=(("qkv_proj", "self_attn.qkv_proj"), ("gate_up_proj", "mlp.gate_up_proj"))),
)}


def hf_family(model_type: str) -> Family | None:
    """The family whose Hugging Face checkpoints have this config.json model_type, if any."""
    return next((f for f in FAMILIES.values() if model_type in f.hf_model_types), None)


def hf_model_types() -> list[str]:
    """Every config.json model_type Ember's engine runs, for messages."""
    return [t for f in FAMILIES.values() for t in f.hf_model_types]


# GGUF architectures llama.cpp runs that Ember's engine leaves to it, and why (logged by `auto`).
NOT_YET: dict[str, str] = {
    "gpt-oss": "MXFP4 experts on Ember's kernels, its router, SwiGLU and biases are not in Ember's engine yet",
    "qwen35": "hybrid linear-attention layers are not in Ember's engine yet",
    "gemma4": "Gemma 4's layers are not in Ember's engine yet",
}


# Sliding-window periods of GGUF architectures llama.cpp runs and Ember's engine does not (for
# the KV footprint; the families' own are their swa_period).
LLAMA_CPP_SWA_PERIOD: dict[str, int] = {"gemma2": 2, "gpt-oss": 2, "cohere2": 4}


def swa_period(arch: str) -> int:
    """llama.cpp's sliding-window period of a GGUF architecture (0: none known)."""
    family = FAMILIES.get(arch)
    return family.swa_period if family else LLAMA_CPP_SWA_PERIOD.get(arch, 0)
