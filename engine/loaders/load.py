"""One entry for the runner: a model file or directory -> LlamaForCausalLM, by what the path is."""
from __future__ import annotations

from pathlib import Path

import torch


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               quantized: bool = False):
    """A .gguf file (engine/loaders/gguf_loader.py) or a Hugging Face directory of safetensors,
    GPTQ, AWQ or compressed-tensors (engine/loaders/hf_loader.py)."""
    if Path(path).is_dir():
        from engine.loaders.hf_loader import load_hf_model

        return load_hf_model(path, dtype, device, quantized)
    from engine.loaders.gguf_loader import load_model as load_gguf

    return load_gguf(path, dtype, device, quantized)
