"""Writes `ember quantize`'s output: a Hugging Face directory that Ember, vLLM and the GPTQ/AWQ
loaders read (config.json with its quantization_config, model.safetensors, the tokenizer files).

Nothing appears at OUT until everything is written: the files go to a hidden sibling folder
that is renamed into place at the end, and removed on any failure or Ctrl-C. Unquantized tensors
(embeddings, norms, biases, the LM head) are stored float16, as GPTQ and AWQ checkpoints do.
Norms are stored as the family's Hugging Face code reads them: Gemma's x * (1 + w) stores w, so
the 1 the GGUF holds is taken off (engine/model_files/families.py hf_norm_offset).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.checkpoint_formats.registry import encode_linear
from engine.loaders.weight_names import FUSED
from engine.model_files.quant_config import QuantSpec
from engine.quant.hf_config import hf_config
from engine.quant.pipeline import LayerResult
from engine.quant.source import GGUFSource, Source
from engine.weights.int_weight import IntWeight, cat_int_rows

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "chat_template.jinja", "vocab.json", "merges.txt", "tokenizer.model")


class CheckpointWriter:
    """Collects each layer's packed tensors, then writes the directory in one go (`finish`)."""

    def __init__(self, out: str | Path, src: Source, spec: QuantSpec) -> None:
        self.out, self.src, self.spec = Path(out), src, spec
        if self.out.exists():
            raise FileExistsError(f"{self.out} exists; choose a new output folder")
        self.tmp = self.out.with_name(f".{self.out.name}.partial-{os.getpid()}")
        if isinstance(src, GGUFSource):  # refused now, not after every layer is quantized
            from engine.loaders.gguf_vocab import check_hf_tokenizer

            check_hf_tokenizer(src.path, src.file)
        self.tensors: dict[str, torch.Tensor] = {}
        self.norm_offset = src.config.family.hf_norm_offset

    def _dense(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """float16, a norm as Hugging Face's code for the family reads it."""
        if name.endswith("norm.weight"):
            t = t - self.norm_offset
        return t.to(torch.float16).contiguous()

    def add_layer(self, i: int, result: LayerResult) -> None:
        p = f"model.layers.{i}."
        weights, dense = self._stored(dict(result.weights), dict(result.dense))
        for module, w in weights.items():
            for suffix, t in encode_linear(w, self.spec).items():
                self.tensors[f"{p}{module}.{suffix}"] = t.contiguous()
        for name, t in dense.items():
            self.tensors[p + name] = self._dense(name, t)

    def _stored(self, weights: dict[str, IntWeight], dense: dict[str, torch.Tensor]):
        """The family's fused modules from their parts (Phi-3: q|k|v as qkv_proj, gate|up as
        gate_up_proj; the Family's hf_fused), weights and biases."""
        for ours, stored in self.src.config.family.hf_fused:
            parts = FUSED[ours][1]
            weights[stored] = cat_int_rows([weights.pop(m) for m in parts])
            if f"{parts[0]}.bias" in dense:
                dense[f"{stored}.bias"] = torch.cat([dense.pop(f"{m}.bias") for m in parts])
        return weights, dense

    def finish(self) -> Path:
        """Write everything to the hidden folder, then rename it to OUT."""
        try:
            self.tmp.mkdir(parents=True)
            src, cfg = self.src, self.src.config
            self.tensors["model.embed_tokens.weight"] = src.tensor("model.embed_tokens.weight").half()
            self.tensors["model.norm.weight"] = self._dense("model.norm.weight", src.tensor("model.norm.weight"))
            if not cfg.tie_word_embeddings:
                self.tensors["lm_head.weight"] = src.tensor("lm_head.weight").half()
            save_file(self.tensors, str(self.tmp / "model.safetensors"), metadata={"format": "pt"})
            (self.tmp / "config.json").write_text(json.dumps(hf_config(cfg, self.spec, src.rope_factors()), indent=2) + "\n")
            self._tokenizer()
            os.replace(self.tmp, self.out)
        except BaseException:
            self.abort()
            raise
        return self.out

    def _tokenizer(self) -> None:
        if isinstance(self.src, GGUFSource):
            from engine.loaders.gguf_vocab import write_hf_tokenizer

            write_hf_tokenizer(self.src.path, self.tmp)
            return
        for name in TOKENIZER_FILES:
            if (self.src.path / name).is_file():
                shutil.copy2(self.src.path / name, self.tmp / name)

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
