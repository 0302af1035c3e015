"""The real machine and the real model file, read for `choose_backend` (engine/model_files/fit.py).

The decision is a pure function there, torch-free, so the model manager's badge uses the same one;
here are the two readers that need the engine's side: `probe_machine` asks torch about CUDA and
MPS and llama.cpp about GPU offload, and `model_footprint` reads the file the engine will load.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from engine.model_files.fit import BackendError, MachineInfo, probe_host
from engine.model_files.footprint import ModelFootprint, footprint_of
from engine.model_files.meta import ModelFileError, read_gguf_meta, read_quantized_dir_meta


def probe_machine() -> MachineInfo:
    """`probe_host` (free RAM, CPUs, bf16) plus CUDA free VRAM and MPS (torch) and llama.cpp's build."""
    import torch

    cuda = torch.cuda.is_available()
    free = total = 0
    name = ""
    if cuda:
        free, total = torch.cuda.mem_get_info()
        name = torch.cuda.get_device_name()
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    mps_max = int(torch.mps.recommended_max_memory()) if mps else 0
    try:
        import llama_cpp
        llama_ok, offload = True, bool(llama_cpp.llama_supports_gpu_offload())
    except ImportError:
        llama_ok, offload = False, False
    return dataclasses.replace(probe_host(), cuda_available=cuda, cuda_name=name, cuda_free_bytes=int(free),
                               cuda_total_bytes=int(total), mps_available=mps, mps_max_bytes=mps_max,
                               llama_cpp_available=llama_ok, llama_cpp_gpu_offload=offload)


def model_footprint(path: str | os.PathLike) -> ModelFootprint:
    """Read a model's footprint from the file itself: a .gguf file (its header, for every
    architecture) or a GPTQ/AWQ/compressed-tensors directory (its config and shards' headers)."""
    p = Path(path)
    if p.is_file():
        return _gguf_footprint(p)
    if not p.is_dir() or not (p / "config.json").is_file():
        raise BackendError(f"{p} is neither a GGUF file nor a model directory with config.json")
    try:
        meta = read_quantized_dir_meta(p)
    except ModelFileError as e:
        raise BackendError(str(e)) from None
    # the config was read (4 or 8 bits: the kernels' widths); a layout they lack is held dense at load
    return dataclasses.replace(footprint_of(meta, sum(f.stat().st_size for f in p.glob("*.safetensors"))),
                               kernels_cover=True)


def _gguf_footprint(p: Path) -> ModelFootprint:
    """The header's facts for any architecture; then Ember's own loader says whether its engine
    runs the file (the Llama/Qwen2 family, RoPE kinds it knows), else llama.cpp is the runner."""
    from engine.loaders.gguf_config import GGUFError, config_from_file, open_gguf
    from engine.loaders.gguf_loader import kernels_cover

    try:
        fp = footprint_of(read_gguf_meta(p), p.stat().st_size)
    except ModelFileError as e:
        raise BackendError(str(e)) from None
    if not fp.ember_engine:
        return fp
    f = open_gguf(p)
    try:
        cfg = config_from_file(f)
    except GGUFError as e:
        return dataclasses.replace(fp, ember_engine=False, ember_engine_why_not=str(e).removeprefix(f"{f.path}: "))
    return dataclasses.replace(fp, num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                               context_length=cfg.context_length, kernels_cover=kernels_cover(f))
