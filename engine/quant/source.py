"""What `ember quantize` reads: a GGUF file or a float safetensors directory, as float32 weights
under Hugging Face names, one at a time.

A GGUF's blocks are dequantized exactly (gguf's own formulas: engine/loaders/dequant.py) and
its llama Q/K rows un-permuted back to Hugging Face's rotate-half order, so the reference
weights of a GGUF source are the file's quantized values, not the original float model's.
Families whose files fuse q|k|v and gate|up (Phi-3: attn_qkv, qkv_proj) hand out each part's
rows under its own name, so every family is quantized linear by linear; the writer stacks them
back (writer.py, the Family's hf_fused).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from engine.layers.llama3_rope import llama3_params
from engine.loaders.weight_names import HF_LINEARS, hf_norms, hf_part, hf_to_gguf
from engine.models.config import ModelConfig

# the Hugging Face linears of a layer, and the names of both kinds: engine/loaders/weight_names.py
LINEARS = HF_LINEARS
# the tensors RoPE's frequencies are divided by, under the GGUF's names (llama3's, LongRoPE's)
ROPE_FACTORS = ("rope_freqs", "rope_factors_short", "rope_factors_long")


class Source(Protocol):
    path: Path
    config: ModelConfig

    def tensor(self, name: str) -> torch.Tensor:
        """float32 tensor by Hugging Face name (model.layers.3.mlp.up_proj.weight, lm_head.weight...)."""

    def has(self, name: str) -> bool: ...

    def rope_factors(self) -> dict[str, torch.Tensor]:
        """The ROPE_FACTORS the model has, float32."""

    def close(self) -> None: ...


def fused_part(config: ModelConfig, name: str) -> tuple[str, list[int], int] | None:
    """A linear's tensor that the family stores inside a fused one (Phi-3's q_proj in qkv_proj):
    (the stored tensor's Hugging Face name, the parts' row counts, this part's index); else None."""
    if not name.startswith("model.layers."):
        return None
    _, _, i, rest = name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    part = hf_part(config.family, module)
    if part is None:
        return None
    ours, stored, index = part
    rows = {"qkv_proj": [config.q_size, config.kv_size, config.kv_size],
            "gate_up_proj": [config.intermediate_size] * 2}[ours]
    return f"model.layers.{i}.{stored}.{kind}", rows, index


@dataclass
class GGUFSource:
    path: Path

    def __post_init__(self) -> None:
        from engine.loaders.gguf_config import config_from_file, open_gguf
        from engine.loaders.gguf_loader import check_tensors

        self.file = open_gguf(self.path)
        self.config = config_from_file(self.file)
        if not self.config.family.hf_class:  # its Family names no Hugging Face architecture
            raise ValueError(f"{self.path}: `ember quantize` cannot write {self.config.arch} checkpoints yet")
        self.tensors = check_tensors(self.file, self.config)
        if self.config.rope_freq_factors:  # refused now, not after quantizing, when config.json cannot say it
            try:
                llama3_params(self._read("rope_freqs.weight"), self.config.head_dim, self.config.rope_theta)
            except ValueError as e:
                raise ValueError(f"{self.path}: {e}; Hugging Face's config.json cannot hold it") from e
        self.permuted = self.config.family.rope_interleaved
        self.gguf_names = hf_to_gguf(self.config.family)

    def _gguf_name(self, name: str) -> str:
        if name == "model.embed_tokens.weight":
            return "token_embd.weight"
        if name == "model.norm.weight":
            return "output_norm.weight"
        if name == "lm_head.weight":
            return "token_embd.weight" if self.config.tie_word_embeddings else "output.weight"
        _, _, i, rest = name.split(".", 3)
        module, kind = rest.rsplit(".", 1)
        return f"blk.{i}.{self.gguf_names[module]}.{kind}"

    def has(self, name: str) -> bool:
        if part := fused_part(self.config, name):
            return self.has(part[0])
        try:
            return self._gguf_name(name) in self.tensors
        except (KeyError, ValueError):
            return False

    def rope_factors(self) -> dict[str, torch.Tensor]:
        return {n: self._read(f"{n}.weight") for n in ROPE_FACTORS if f"{n}.weight" in self.tensors}

    def _read(self, gguf_name: str) -> torch.Tensor:
        from gguf import GGMLQuantizationType as QT

        from engine.loaders.dequant import dequantize

        t = self.tensors[gguf_name]
        return dequantize(self.file.raw(t), QT(t.qtype), t.shape, "cpu").float()

    def tensor(self, name: str) -> torch.Tensor:
        from engine.loaders.gguf_loader import unpermute_rows

        if part := fused_part(self.config, name):  # Phi-3's q, k, v: rows of attn_qkv
            stored, rows, index = part
            return self.tensor(stored).split(rows)[index].contiguous()
        w = self._read(self._gguf_name(name))
        if self.permuted and (".q_proj." in name or ".k_proj." in name):
            heads = self.config.num_heads if ".q_proj." in name else self.config.num_kv_heads
            w = unpermute_rows(w, heads)
        return w

    def close(self) -> None:
        pass


@dataclass
class HFSource:
    path: Path

    def __post_init__(self) -> None:
        from engine.loaders.hf_checkpoint import HFCheckpoint

        self.ckpt = HFCheckpoint(self.path)
        if self.ckpt.quant is not None:
            raise ValueError(f"{self.path}: already quantized ({self.ckpt.quant.format}); "
                             "quantize from the float checkpoint or a GGUF file")
        self.config = self.ckpt.config

    def has(self, name: str) -> bool:
        part = fused_part(self.config, name)
        return (part[0] if part else name) in self.ckpt

    def rope_factors(self) -> dict[str, torch.Tensor]:
        return self.ckpt.rope_factors()

    def tensor(self, name: str) -> torch.Tensor:
        if part := fused_part(self.config, name):  # Phi-3's q, k, v: rows of qkv_proj
            stored, rows, index = part
            return self.tensor(stored).split(rows)[index].contiguous()
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            name = "model.embed_tokens.weight"
        if name.endswith("norm.weight"):  # as the engine (and a GGUF) takes it: Gemma's 1 + w
            return self.ckpt.norm(name, self.ckpt.shape(name))
        return self.ckpt.dense(name, self.ckpt.shape(name))

    def close(self) -> None:
        self.ckpt.close()


def open_source(path: str | Path) -> GGUFSource | HFSource:
    p = Path(path)
    if p.is_dir():
        return HFSource(p)
    if p.is_file():
        return GGUFSource(p)
    raise FileNotFoundError(f"{p}: no such file or directory")


def norm_modules(config: ModelConfig) -> list[str]:
    """The Hugging Face modules of a layer's norms in this family (Gemma's four and q/k's)."""
    family = config.family
    ours = ["input_layernorm", "post_attention_layernorm"] + (["q_norm", "k_norm"] if family.qk_norm else [])
    ours += ["attn_output_norm", "mlp_output_norm"] if family.post_norms else []
    return [hf_norms(config.family)[n] for n in ours]


def layer_weights(src: Source, i: int) -> dict[str, torch.Tensor]:
    """Layer i's float32 tensors by Hugging Face module name ("mlp.up_proj.weight", ...); norms
    as the engine's plain RMSNorm takes them (engine/model_files/families.py hf_norm_offset)."""
    p = f"model.layers.{i}."
    names = [f"{m}.weight" for m in LINEARS] + [f"{m}.weight" for m in norm_modules(src.config)]
    if src.config.attention_bias:
        names += ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"]
    return {n: src.tensor(p + n) for n in names}
