"""What a GPTQ, AWQ or compressed-tensors checkpoint says it is: its quantization_config, read
and written (the tensor layouts themselves: engine/checkpoint_formats/). No torch here: the model
store and the GUI check a downloaded or imported directory with it before anything loads.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from engine.model_files.errors import ModelFileError


class CheckpointFormat(enum.StrEnum):
    GPTQ = "gptq"
    GPTQ_V2 = "gptq_v2"
    AWQ = "awq"
    COMPRESSED_TENSORS = "compressed-tensors"


class CheckpointError(ModelFileError):
    """A checkpoint Ember cannot load; the message names the file/tensor and the problem."""


@dataclass(frozen=True)
class QuantSpec:
    format: CheckpointFormat
    bits: int
    group_size: int  # -1: one group spans K
    sym: bool
    desc_act: bool
    ignore: tuple[str, ...] = ()  # module names the config lists as left dense (e.g. "lm_head")


def check_spec(spec: QuantSpec, where: str) -> None:
    if spec.bits not in (4, 8):
        raise CheckpointError(f"{where}: {spec.format} with {spec.bits} bits: Ember's kernels take 4 and 8")
    if spec.format is CheckpointFormat.AWQ and spec.bits != 4:
        raise CheckpointError(f"{where}: AWQ GEMM checkpoints are 4-bit only, not {spec.bits}")
    if spec.group_size != -1 and spec.group_size < 1:
        raise CheckpointError(f"{where}: group_size {spec.group_size}: expected -1 or a positive size")


CT_FORMAT = "pack-quantized"
GROUP_ORDER = {"group", "dynamic"}  # actorder values that store weight_g_idx ("dynamic" = alias)
FLAT_ORDER = {None, False, "weight", "static"}  # act-order only during calibration: no g_idx


def parse_quantization_config(cfg: dict, where: str) -> QuantSpec:
    """The spec of config.json's "quantization_config", or of a quantize_config.json (AutoGPTQ)
    or quant_config.json (AutoAWQ, legacy keys w_bit/q_group_size/zero_point/version)."""
    method = str(cfg.get("quant_method", "")).lower()
    if not method:  # the tools' own files predate quant_method
        method = "awq" if {"w_bit", "zero_point", "version"} & cfg.keys() else "gptq" if "bits" in cfg else ""
    where = f"{where}: quantization_config"
    if method == CheckpointFormat.COMPRESSED_TENSORS:
        return _parse_compressed_tensors(cfg, where)
    if method not in ("gptq", "awq"):
        raise CheckpointError(f"{where}: quant_method {cfg.get('quant_method')!r}: Ember reads gptq, "
                              f"awq and compressed-tensors")
    bits, group = cfg.get("bits", cfg.get("w_bit")), cfg.get("group_size", cfg.get("q_group_size", -1))
    if not isinstance(bits, int) or not isinstance(group, int):
        raise CheckpointError(f"{where}: bits {bits!r} and group_size {group!r} must be integers")
    extra = tuple(cfg.get("modules_to_not_convert") or ())
    if method == "gptq":
        fmt = str(cfg.get("checkpoint_format", cfg.get("format", "gptq"))).lower()
        if fmt not in (CheckpointFormat.GPTQ, CheckpointFormat.GPTQ_V2):
            raise CheckpointError(f"{where}: GPTQ checkpoint_format {fmt!r}: Ember reads 'gptq' and 'gptq_v2'")
        if cfg.get("dynamic"):
            raise CheckpointError(f"{where}: per-module overrides ('dynamic') are not supported")
        spec = QuantSpec(CheckpointFormat(fmt), bits, group, bool(cfg.get("sym", True)),
                         bool(cfg.get("desc_act", False)), extra)
    else:
        version = str(cfg.get("version", "gemm")).lower()
        if version != "gemm":
            raise CheckpointError(f"{where}: AWQ version {version!r}: only the GEMM layout is supported")
        if not cfg.get("zero_point", True):
            raise CheckpointError(f"{where}: AWQ zero_point false: GEMM checkpoints carry zero points")
        spec = QuantSpec(CheckpointFormat.AWQ, bits, group, False, False, extra)
    check_spec(spec, where)
    return spec


def quantization_config(spec: QuantSpec) -> dict:
    """config.json's "quantization_config" as GPTQModel / AutoAWQ / llm-compressor write it, for
    a checkpoint whose LM head is dense (as `ember quantize` writes it): GPTQ says lm_head false,
    AWQ never quantizes it, compressed-tensors (which targets every Linear) lists it in ignore.
    spec.ignore goes to modules_to_not_convert (GPTQ/AWQ) or ignore (compressed-tensors)."""
    check_spec(spec, "quantization_config")
    if spec.format is CheckpointFormat.COMPRESSED_TENSORS:
        return _compressed_tensors_config(spec)
    if spec.format is CheckpointFormat.AWQ:
        if spec.sym or spec.desc_act:
            raise CheckpointError("quantization_config: AWQ GEMM is asymmetric and without act-order")
        return {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": spec.group_size,
                "zero_point": True, "modules_to_not_convert": list(spec.ignore) or None}
    out = {"quant_method": "gptq", "checkpoint_format": str(spec.format), "bits": spec.bits,
           "group_size": spec.group_size, "sym": spec.sym, "desc_act": spec.desc_act,
           "static_groups": False, "pack_dtype": "int32", "lm_head": False}
    return out | ({"modules_to_not_convert": list(spec.ignore)} if spec.ignore else {})


def _parse_compressed_tensors(cfg: dict, where: str) -> QuantSpec:
    """The spec of a compressed-tensors quantization_config (one weight scheme for all Linears)."""
    groups = cfg.get("config_groups") or {}
    schemes = [g for g in groups.values() if isinstance(g, dict) and g.get("weights")]
    if not schemes:
        raise CheckpointError(f"{where}: config_groups has no scheme with 'weights'")
    for g in schemes:
        fmt = g.get("format") or cfg.get("format")
        if fmt != CT_FORMAT:
            raise CheckpointError(f"{where}: compressed-tensors format {fmt!r}: Ember reads {CT_FORMAT!r} only")
        if g.get("input_activations") or g.get("output_activations"):
            raise CheckpointError(f"{where}: quantized activations are not supported (weight-only "
                                  f"schemes, W4A16/W8A16, are)")
    w = schemes[0]["weights"]
    if any(g["weights"] != w for g in schemes[1:]):
        raise CheckpointError(f"{where}: config_groups with different weight schemes are not supported")
    if w.get("type", "int") != "int":
        raise CheckpointError(f"{where}: weights of type {w.get('type')!r}: Ember reads integer weights")
    strategy, actorder = w.get("strategy"), w.get("actorder")
    if strategy == "group":
        group = w.get("group_size")
    elif strategy == "channel":
        group = -1
    else:
        raise CheckpointError(f"{where}: weight strategy {strategy!r}: Ember reads 'group' and 'channel'")
    if actorder is True:
        actorder = "group"  # the library's validator does the same
    if actorder not in GROUP_ORDER | FLAT_ORDER:
        raise CheckpointError(f"{where}: actorder {actorder!r}: expected group, weight or none")
    bits = w.get("num_bits")
    if not isinstance(bits, int) or not isinstance(group, int):
        raise CheckpointError(f"{where}: num_bits {bits!r} and group_size {group!r} must be integers")
    spec = QuantSpec(CheckpointFormat.COMPRESSED_TENSORS, bits, group, bool(w.get("symmetric", True)),
                     actorder in GROUP_ORDER, tuple(cfg.get("ignore") or ()))
    check_spec(spec, where)
    return spec


def _compressed_tensors_config(spec: QuantSpec) -> dict:
    """As llm-compressor writes it for a W4A16/W8A16 model; "lm_head" is always in ignore (the
    scheme targets every Linear, and `ember quantize` keeps the head dense)."""
    weights = {"num_bits": spec.bits, "type": "int", "symmetric": spec.sym,
               "strategy": "channel" if spec.group_size == -1 else "group",
               "group_size": None if spec.group_size == -1 else spec.group_size,
               "actorder": "group" if spec.desc_act else None,
               "dynamic": False, "block_structure": None, "observer": "minmax", "observer_kwargs": {}}
    return {"quant_method": "compressed-tensors", "format": CT_FORMAT, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": None, "output_activations": None}},
            "ignore": list(spec.ignore) + ([] if "lm_head" in spec.ignore else ["lm_head"]),
            "kv_cache_scheme": None, "sparsity_config": {},
            "global_compression_ratio": None}


