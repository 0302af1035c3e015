"""A Hugging Face directory (GPTQ, AWQ, compressed-tensors or plain float safetensors) -> a ready
LlamaForCausalLM, through the same weight names and model code as a GGUF file.

A quantized linear is decoded by its format (engine/checkpoint_formats/) into an IntWeight,
w = s (q - z), and handed to the kernels as a QuantWeight (IntWeight.to_quant_weight: the group
of 128 becomes four of the kernels' 32, an act-order checkpoint gets its input permutation, so
its groups are contiguous). With `quantized` off, or a layout the kernels have no tiles for, the
weight is dequantized once, here, and held dense. q/k/v (and gate/up) fuse into one matrix as
for GGUF; act-order parts whose permutations differ stay dense rather than unfused.
"""
from __future__ import annotations

from pathlib import Path

import torch

from engine.loaders.assemble import assemble
from engine.loaders.hf_checkpoint import HFCheckpoint
from engine.loaders.gguf_loader import ROTARY_ROWS, rotary_rows
from engine.loaders.weight_names import NORMS, hf_norms, hf_stored
from engine.models.llama import LlamaForCausalLM
from engine.checkpoint_formats.registry import decode_linear, tensor_names
from engine.weights.rtn import rtn
from engine.weights.int_weight import IntWeight
from engine.weights.quant_weight import QuantWeight, cat_rows, same_columns


def is_quantized(ckpt: HFCheckpoint, module: str) -> bool:
    """The module has any of its format's tensors (and is not on the format's ignore list): one
    that lost its packed weight is still quantized, and the format says which tensor is missing."""
    spec = ckpt.quant
    if spec is None or any(module == i or module.endswith("." + i) for i in spec.ignore):
        return False
    return any(f"{module}.{s}" in ckpt for s in tensor_names(spec))


def read_linear(ckpt: HFCheckpoint, module: str, shape: tuple[int, int]) -> IntWeight | torch.Tensor:
    """One linear's weight: an IntWeight when the checkpoint holds it quantized, else float32.
    Errors name the shard that holds the module's tensors."""
    if is_quantized(ckpt, module):
        names = tensor_names(ckpt.quant)
        shard = next(ckpt.tensors[f"{module}.{s}"] for s in names if f"{module}.{s}" in ckpt)
        return decode_linear(ckpt.group(module, names), ckpt.quant, shape, f"{shard}: {module}")
    return ckpt.dense(f"{module}.weight", shape)


class HFWeights:
    """`take` over a Hugging Face checkpoint: our weight name -> a tensor, a QuantWeight kept on
    the kernels, or None; `dense_reasons` says what stayed dense and why."""

    def __init__(self, ckpt: HFCheckpoint, dtype: torch.dtype, device: str | torch.device, quantized: bool) -> None:
        self.ckpt, self.cfg, self.dtype, self.device, self.quantized = ckpt, ckpt.config, dtype, device, quantized
        d, q, kv, f = self.cfg.hidden_size, self.cfg.q_size, self.cfg.kv_size, self.cfg.intermediate_size
        self.out_in = {"self_attn.q_proj": (q, d), "self_attn.k_proj": (kv, d), "self_attn.v_proj": (kv, d),
                       "self_attn.o_proj": (d, q), "mlp.gate_proj": (f, d), "mlp.up_proj": (f, d),
                       "mlp.down_proj": (d, f), "self_attn.qkv_proj": (q + 2 * kv, d), "mlp.gate_up_proj": (2 * f, d)}
        self.stored = hf_stored(self.cfg.family)  # Phi-3's fused modules, others' parts
        self.dense_reasons: set[str] = set()

    def as_layer(self, parts: list[IntWeight | torch.Tensor], name: str) -> torch.Tensor | QuantWeight:
        if self.quantized and all(isinstance(p, IntWeight) for p in parts):
            qws = [p.to_quant_weight() for p in parts]
            if all(w is not None for w in qws) and same_columns(qws):
                w = qws[0] if len(qws) == 1 else cat_rows(qws)
                return w.to(self.device)
            self.dense_reasons.add(f"{name}: groups or act-order the kernels have no layout for")
        dense = [p.dequantize() if isinstance(p, IntWeight) else p for p in parts]
        return torch.cat(dense).to(device=self.device, dtype=self.dtype)

    def vocab_matrix(self, name: str) -> torch.Tensor | QuantWeight:
        """The LM head or the embedding table [vocab, d]. GPTQ and AWQ leave them float16;
        quantized, they are rounded to 8 bits per 32 values here, as llama.cpp keeps a GGUF's
        output at Q8_0: the head is the largest matrix of a small model (float, it would cost
        more per token than all the 4-bit layers), and the table is looked up in its rows."""
        d = self.cfg.hidden_size
        w = self.ckpt.dense(name, (self.cfg.vocab_size, d))
        if self.quantized and d % 32 == 0:
            return rtn(w, 8, 32, sym=True).to_quant_weight().to(self.device)
        return w.to(device=self.device, dtype=self.dtype)

    def head(self) -> torch.Tensor | QuantWeight:
        """The LM head (the table itself when tied), as the checkpoint holds it or in 8 bits."""
        if is_quantized(self.ckpt, "lm_head"):
            shape = (self.cfg.vocab_size, self.cfg.hidden_size)
            return self.as_layer([read_linear(self.ckpt, "lm_head", shape)], "lm_head")
        tied = self.cfg.tie_word_embeddings
        return self.vocab_matrix("model.embed_tokens.weight" if tied else "lm_head.weight")

    def take(self, key: str):
        if key == "embed_tokens.weight":  # tied: looked up in the head (quantized: its rows)
            return self.head() if self.cfg.tie_word_embeddings else self.vocab_matrix("model.embed_tokens.weight")
        if key == "lm_head.weight":
            return self.head()
        if key == "norm.weight":
            norm = self.ckpt.norm("model.norm.weight", (self.cfg.hidden_size,))
            return norm.to(device=self.device, dtype=self.dtype)
        if key in ("rope_freqs", "rope_factors_short", "rope_factors_long"):
            return self.ckpt.rope_factors().get(key)
        _, _, leaf = key.split(".", 2)
        w = self.layer_weight(key)
        if w is not None and self.cfg.rotary_dim and leaf in ROTARY_ROWS:  # as the GGUF loader moves them
            order = rotary_rows(self.cfg, leaf)
            w = w.rows(order.to(w.q.device)) if isinstance(w, QuantWeight) else w[order.to(w.device)]
        return w

    def layer_weight(self, key: str):
        """layers.{i}.{name}.{kind}: a norm, a (fused) linear or its bias."""
        _, i, leaf = key.split(".", 2)
        prefix = f"model.layers.{i}."
        name, _, kind = leaf.rpartition(".")
        if name in NORMS:  # q/k norms are one head wide
            width = self.cfg.head_dim if name in ("q_norm", "k_norm") else self.cfg.hidden_size
            norm = self.ckpt.norm(prefix + f"{hf_norms(self.cfg.family)[name]}.weight", (width,))
            return norm.to(device=self.device, dtype=self.dtype)
        modules = self.stored[name]
        if kind == "bias":
            if not self.cfg.attention_bias:
                return None
            return torch.cat([self.ckpt.dense(prefix + f"{m}.bias", (self.out_in[m][0],))
                              for m in modules]).to(self.device)
        return self.as_layer([read_linear(self.ckpt, prefix + m, self.out_in[m]) for m in modules],
                             f"layer {i} {name}")


def load_hf_model(path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                  quantized: bool = False) -> LlamaForCausalLM:
    """Read, check and assemble the model on `device`; with `quantized`, quantized linears stay
    4/8-bit on the kernels (or tinygemm on CUDA), others are dense in `dtype`."""
    ckpt = HFCheckpoint(path)
    weights = HFWeights(ckpt, dtype, device, quantized)
    try:
        return assemble(ckpt.config, weights.take, dtype, ckpt.path, weights.dense_reasons)
    finally:
        ckpt.close()
