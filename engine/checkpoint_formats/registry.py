"""The layout module of each checkpoint format, and one linear's way in and out through it."""
from __future__ import annotations

from types import ModuleType

import torch

from engine.checkpoint_formats import awq, compressed_tensors, gptq
from engine.checkpoint_formats.checks import check_weight
from engine.model_files.quant_config import CheckpointFormat, QuantSpec, check_spec
from engine.weights.int_weight import IntWeight

# Each module has tensor_names(spec), encode(w, spec) and decode(tensors, spec, shape, where).
LAYOUTS: dict[CheckpointFormat, ModuleType] = {
    CheckpointFormat.GPTQ: gptq, CheckpointFormat.GPTQ_V2: gptq, CheckpointFormat.AWQ: awq,
    CheckpointFormat.COMPRESSED_TENSORS: compressed_tensors,
}


def tensor_names(spec: QuantSpec) -> tuple[str, ...]:
    """Suffixes of one linear's tensors (the first is the packed weight; some may be optional)."""
    return LAYOUTS[spec.format].tensor_names(spec)


def encode_linear(w: IntWeight, spec: QuantSpec) -> dict[str, torch.Tensor]:
    """IntWeight -> suffix -> tensor, in the dtypes the format stores (for the writer)."""
    check_weight(w, spec, f"encode_linear ({spec.format})")
    return LAYOUTS[spec.format].encode(w, spec)


def decode_linear(tensors: dict[str, torch.Tensor], spec: QuantSpec, shape: tuple[int, int],
                  where: str) -> IntWeight:
    """The IntWeight of one linear [N = out, K = in], every tensor checked against shape and spec."""
    check_spec(spec, where)
    return LAYOUTS[spec.format].decode(tensors, spec, shape, where)
