"""The checks every layout's decoder and encoder makes: tensors present with the dtype and shape
the config implies, codes that fit the spec, group maps in range. Every failure is a
CheckpointError naming the tensor and the problem."""
from __future__ import annotations

import torch

from engine.model_files.quant_config import CheckpointError, QuantSpec, check_spec
from engine.weights.int_weight import IntWeight

INT32 = (torch.int32,)
INDEX = (torch.int32, torch.int64)
FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def n_groups(K: int, group_size: int) -> int:
    return 1 if group_size == -1 else -(-K // group_size)


def default_groups(K: int, group_size: int) -> torch.Tensor:
    return torch.zeros(K, dtype=torch.long) if group_size == -1 else torch.arange(K) // group_size


def expect(tensors: dict[str, torch.Tensor], name: str, dtypes: tuple[torch.dtype, ...],
           shape: tuple[int, ...], where: str, why: str) -> torch.Tensor:
    """tensors[name], checked for presence, dtype and shape; `why` says where the shape comes from."""
    t = tensors.get(name)
    want = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
    if t is None:
        raise CheckpointError(f"{where}: tensor '{name}' is missing (expected {want} {list(shape)}; "
                              f"found {sorted(tensors) or 'none'})")
    if t.dtype not in dtypes:
        raise CheckpointError(f"{where}: tensor '{name}' has dtype {str(t.dtype).removeprefix('torch.')}, "
                              f"expected {want}")
    if tuple(t.shape) != tuple(shape):
        raise CheckpointError(f"{where}: tensor '{name}' has shape {list(t.shape)}, expected "
                              f"{list(shape)} ({why})")
    return t


def check_weight(w: IntWeight, spec: QuantSpec, where: str) -> None:
    """An IntWeight that `spec` can carry without loss."""
    check_spec(spec, where)
    if (w.bits, w.group_size) != (spec.bits, spec.group_size):
        raise CheckpointError(f"{where}: weight is {w.bits}-bit group {w.group_size}, spec says "
                              f"{spec.bits}-bit group {spec.group_size}")
    top = (1 << spec.bits) - 1
    if int(w.q.max()) > top or int(w.zeros.max()) > top:
        raise CheckpointError(f"{where}: codes above {top} do not fit {spec.bits} bits")
    K = w.shape[1]
    if not spec.desc_act and not torch.equal(w.groups(), default_groups(K, spec.group_size)):
        raise CheckpointError(f"{where}: the weight has act-order groups (g_idx) but the spec has "
                              f"desc_act false, so readers would ignore them")


def read_g_idx(tensors: dict[str, torch.Tensor], name: str, K: int, group_size: int, where: str,
               why: str) -> torch.Tensor | None:
    """int32 g_idx from tensors[name], or None when it is k // G (kept only when the groups are
    really permuted)."""
    n_g = n_groups(K, group_size)
    g = expect(tensors, name, INDEX, (K,), where, why)
    if g.numel() and (int(g.min()) < 0 or int(g.max()) >= n_g):
        raise CheckpointError(f"{where}: tensor '{name}' holds groups {int(g.min())}..{int(g.max())}, "
                              f"expected 0..{n_g - 1}")
    g = g.to(torch.int32)
    return None if torch.equal(g.long(), default_groups(K, group_size)) else g


def multiple(value: int, of: int, what: str, why: str, where: str) -> None:
    if value % of:
        raise CheckpointError(f"{where}: {what} = {value} is not a multiple of {of} ({why})")
