"""The memory roofline of a decode step: what no engine can pass on this machine.

One decoded token reads every weight matrix once (the embedding table only one row, unless it is
also the head) and every layer's keys and values of its context, so tok/s ≤ read rate / bytes
per token. The read rate is measured here, on the same threads, as a sum() over as many bytes as
the model's weights: a plain stream that the kernels' loads can match but not beat.
"""
from __future__ import annotations

import statistics
import time


def stream(nbytes: int):
    """A float32 tensor of `nbytes`, touched (a fresh allocation would time its page faults)."""
    import torch

    return torch.rand(max(nbytes // 4, 1))


def read_seconds(data) -> float:
    """Seconds of one sum() over `data` (see stream()), on torch's threads."""
    t0 = time.perf_counter()
    data.sum()
    return time.perf_counter() - t0


def read_rate(data, repeats: int = 3) -> float:
    """Bytes per second of sum() over `data` (see stream()), median of `repeats`, on torch's threads."""
    return data.numel() * 4 / statistics.median(read_seconds(data) for _ in range(repeats))


def gguf_bytes_per_token(path: str) -> int:
    """Bytes of a GGUF file's tensors that llama.cpp reads per token: all of them, less the token
    table when a separate output tensor is the head (the table gives one row a token), and a
    mixture's experts at the share one token takes (n_used of n_experts of each stack)."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    tensors = {t.name: int(t.n_bytes) for t in reader.tensors}
    table = tensors.get("token_embd.weight", 0) if "output.weight" in tensors else 0
    arch = reader.fields["general.architecture"].contents()
    n, used = (reader.fields[f"{arch}.{k}"].contents() if f"{arch}.{k}" in reader.fields else 0
               for k in ("expert_count", "expert_used_count"))
    experts = sum(v for k, v in tensors.items() if "_exps." in k) if n and used else 0
    return sum(tensors.values()) - table - experts + (experts * used // n if experts else 0)


def model_bytes_per_token(model) -> int:
    """Bytes of Ember's loaded model that a decode step reads: the memory its parameters and
    buffers cover, each byte once (a tied head and its table are one), less the lookup table
    when it is not also the head. Counted by tensor extent, not storage: the weight arena
    (engine/weight_arena.py) puts every tensor, the table included, in one storage."""
    import torch

    lookup_only = []
    if getattr(model, "embed_tokens", None) is not None:
        lookup_only.append(model.embed_tokens)
    table = getattr(model, "_table", None)
    if table is not None and table is not getattr(model, "lm_head", None):
        lookup_only += list(table.parameters())
    head = {id(p) for p in model.lm_head.parameters()}
    skip = {id(t) for t in lookup_only} - head
    experts, share = _experts(model)  # a mixture: each expert's weights, read by k / n of the tokens
    skip |= {id(t) for t in experts}
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers()) if id(t) not in skip}
    plain, opaque = [], 0  # oneDNN's opaque tensors have no address: they are their own memory
    for t in tensors.values():
        if t.is_mkldnn or t.layout != torch.strided:
            opaque += t.numel() * t.element_size()
        else:
            plain.append(t)
    return covered(map(_extent, plain)) + opaque + int(sum(t.numel() * t.element_size() for t in experts) * share)


def _experts(model) -> tuple[list, float]:
    """A mixture of experts' expert tensors (engine/layers/moe.py) and the share of them one
    token reads (experts used / experts); ([], 0) for a dense model."""
    config = model.config
    if not config.num_experts:
        return [], 0.0
    tensors = [t for layer in model.layers for lin in (*layer.mlp.gate_up, *layer.mlp.down) for t in lin.parameters()]
    return tensors, config.num_experts_used / config.num_experts


def covered(extents) -> int:
    """Bytes in the union of [start, end) intervals."""
    total, reach = 0, None
    for start, end in sorted(extents):
        if reach is None or start >= reach:
            total, reach = total + end - start, end
        elif end > reach:
            total, reach = total + end - reach, end
    return total


def _extent(t) -> tuple[int, int]:
    """[first byte, past the last) of a strided tensor's elements."""
    span = sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1 if t.numel() else 0
    return (t.data_ptr(), t.data_ptr() + span * t.element_size())


def kv_bytes_read(config, context: int, row_bytes: float) -> int:
    """Bytes of keys and values one decode step reads at `context` tokens: per layer, K and V
    rows of `row_bytes` per KV head for each token it attends to (a sliding-window layer, its
    window). row_bytes: head_dim * 2 for bf16/f16 (llama.cpp's f16 cache), more for q8_0."""
    windows = [config.window(i) for i in range(config.num_layers)]
    tokens = sum(min(context, w) if w else context for w in windows)
    return int(tokens * 2 * config.num_kv_heads * row_bytes)


def roofline_rows(decode: dict[str, float], per_token: dict[str, int], rate: float,
                  kv: dict[str, int] | None = None) -> list[str]:
    """The table's lines: per engine, MiB read per token (of which K and V, where given), the
    roofline in tok/s and the fraction of it the measured decode reached."""
    kv = kv or {}
    lines = [f"{'engine':<12}{'MiB/token':>12}{'of it KV':>10}{'roofline tok/s':>16}{'reached':>9}"]
    for name, tok_s in decode.items():
        nbytes = per_token.get(name)
        if not nbytes:
            continue
        roof = rate / nbytes
        lines.append(f"{name:<12}{nbytes / 2**20:>12.0f}{kv.get(name, 0) / 2**20:>10.1f}{roof:>16.1f}{tok_s / roof:>9.0%}")
    return lines
