"""config.json for `ember quantize`'s output: the family's Hugging Face names (its Family's
hf_model_types and hf_class), the model's dimensions and the format's quantization_config."""
from __future__ import annotations

import torch

from engine.layers.llama3_rope import llama3_params
from engine.model_files.quant_config import QuantSpec, quantization_config
from engine.models.config import ModelConfig

# our activation -> Hugging Face's name for it
HF_ACTIVATIONS = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh"}


def hf_config(config: ModelConfig, spec: QuantSpec, rope_factors: dict[str, torch.Tensor] | None = None) -> dict:
    """config.json; rope_factors: the model's RoPE frequency factors by GGUF name (source.ROPE_FACTORS)."""
    family = config.family
    out = {"architectures": [family.hf_class], "model_type": family.hf_model_types[0], "vocab_size": config.vocab_size,
           "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
           "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
           "num_key_value_heads": config.num_kv_heads, "head_dim": config.head_dim,
           "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta,
           "max_position_embeddings": config.context_length, "tie_word_embeddings": config.tie_word_embeddings,
           "hidden_act": HF_ACTIVATIONS[family.activation], "torch_dtype": "float16",
           "quantization_config": quantization_config(spec)}
    if family.hf_attention_bias is None:  # the families whose config.json states it
        out["attention_bias"] = config.attention_bias
    if config.layer_rope and config.rope_theta_local is None:  # SmolLM3: 1 where a layer turns q and k
        out["no_rope_layers"] = [int(config.rope(i) >= 0) for i in range(config.num_layers)]
    if config.rope_scaling is not None:
        out["rope_scaling"] = {"rope_type": config.rope_scaling.type, "type": config.rope_scaling.type,
                               "factor": config.rope_scaling.factor}
    if config.rope_freq_factors:  # Llama 3.x: the numbers the file's rope_freqs was made from
        out["rope_scaling"] = {"rope_type": "llama3", "type": "llama3"} | llama3_params(
            (rope_factors or {})["rope_freqs"], config.head_dim, config.rope_theta)
    own_keys = FAMILY_KEYS.get(config.arch)
    return out | own_keys(config, rope_factors or {}) if own_keys else out


def phi3_keys(config: ModelConfig, factors: dict[str, torch.Tensor]) -> dict:
    """Phi-3's: the share of each head RoPE turns, LongRoPE's factor sets with the file's cos/sin
    scale as attention_factor (else transformers derives it from the context ratio, in float64),
    and no sliding window: llama.cpp runs Phi's layers full, and so does Ember (families.py)."""
    out = {"partial_rotary_factor": (config.rotary_dim or config.head_dim) / config.head_dim,
           "sliding_window": None}
    if config.rope_long_factors:
        out["original_max_position_embeddings"] = config.rope_original_context
        out["rope_scaling"] = {"type": "longrope", "rope_type": "longrope",
                               "short_factor": factors["rope_factors_short"].tolist(),
                               "long_factor": factors["rope_factors_long"].tolist(),
                               "attention_factor": config.rope_attn_factor,
                               "original_max_position_embeddings": config.rope_original_context}
    return out


def gemma3_keys(config: ModelConfig, _factors: dict[str, torch.Tensor]) -> dict:
    """Gemma 3's own keys: its activation's key, the query scale's divisor, the window and which
    layers slide (layer_types), the local layers' RoPE base, and no softcapping (Gemma 3 has none)."""
    windows = [config.window(i) for i in range(config.num_layers)]
    return {"hidden_activation": HF_ACTIVATIONS[config.family.activation],
            "query_pre_attn_scalar": round(config.scale ** -2),
            "sliding_window": max(windows) or config.context_length,
            "layer_types": ["sliding_attention" if w else "full_attention" for w in windows],
            "rope_local_base_freq": config.rope_theta_local,
            "final_logit_softcapping": None, "attn_logit_softcapping": None}


# the families whose config.json holds keys of their own, and what writes them
FAMILY_KEYS = {"gemma3": gemma3_keys, "phi3": phi3_keys}
