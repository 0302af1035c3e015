"""Calibration for GPTQ and AWQ: token samples, and one decoder layer run on them with the
engine's own layer code (engine/models/llama.py), so the activations a quantizer sees are the
ones the engine will compute.

Default text: the Python standard library this process runs on (its documentation topics,
`pydoc_data/topics.py`, prose about a programming language, and its own modules' code), which
is on every machine, license-clean, and needs no download. `ember bench quant` measures
perplexity on other text (the held-out half of the topics, and tests/data/corpus), so the
calibration set is not the test set.
"""
from __future__ import annotations

import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from engine.layers.attention import AttentionMetadata
from engine.layers.rotary import RotaryEmbedding
from engine.models.config import ModelConfig
from engine.models.llama import LlamaAttention, LlamaDecoderLayer, global_rotary

BLOCK = 16  # the scratch KV pool's block size


def doc_topics(half: int) -> str:
    """Python's documentation topics, every other one: half 0 calibrates, half 1 is held out
    (`ember bench quant` measures perplexity on it: same kind of text, none of the same words)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics)[half::2])


def default_calibration_text(max_chars: int = 1 << 20) -> str:
    """Prose and code from the standard library, interleaved, deterministic for one Python."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    code = "".join((lib / m).read_text(encoding="utf-8", errors="replace")
                   for m in ("textwrap.py", "json/decoder.py", "heapq.py", "fractions.py", "difflib.py"))
    prose = doc_topics(0)
    parts, step = [], 4096
    for k in range(0, max(len(prose), len(code)), step):
        parts += [prose[k:k + step], code[k:k + step // 2]]
    return "".join(parts)[:max_chars]


def samples(ids: list[int], num_samples: int, seq_len: int) -> torch.Tensor:
    """int64 [n, seq_len]: consecutive, non-overlapping windows of the tokenized text."""
    n = min(num_samples, len(ids) // seq_len)
    if n < 1:
        raise ValueError(f"the calibration text has {len(ids)} tokens, fewer than one sample of {seq_len}")
    return torch.tensor(ids[: n * seq_len], dtype=torch.long).view(n, seq_len)


@dataclass
class LayerRun:
    """Runs one layer over every sample (prefill, causal), in batches, on a scratch KV pool."""

    config: ModelConfig
    seq_len: int
    batch: int = 4
    rope_factors: dict[str, torch.Tensor] = field(default_factory=dict)  # source.ROPE_FACTORS it has
    # float64 (GPTQ): the forward's last bits then differ between CPUs' kernels only below float32's,
    # and the stream and the captured inputs are rounded to float32, so every CPU sees the same
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        c = self.config
        positions = torch.arange(self.seq_len).repeat(self.batch)  # one batch's positions
        # the tables a layer's config.rope(i) picks, as the model's rotations(): global, then local
        # (Gemma 3's sliding layers: their own base, unscaled). LongRoPE's factors are those a
        # context of one sample takes (the short set unless samples pass the original context).
        rotary = global_rotary(c, self.rope_factors.get)
        rotary.use_context(self.seq_len)
        self.tables = [rotary(positions)]
        if c.rope_theta_local is not None:
            self.tables.append(RotaryEmbedding(c.head_dim, c.rope_theta_local)(positions))
        self.tables = [(cos.to(self.dtype), sin.to(self.dtype)) for cos, sin in self.tables]
        nb = -(-self.seq_len // BLOCK)
        shape = (self.batch * nb, BLOCK, c.num_kv_heads, c.head_dim)
        self.kv = (torch.zeros(shape, dtype=self.dtype), torch.zeros(shape, dtype=self.dtype))
        self.nb = nb

    def _meta(self, S: int) -> AttentionMetadata:
        T, nb = self.seq_len, self.nb
        table = torch.arange(S * nb).view(S, nb)
        slots = (table[:, :, None] * BLOCK + torch.arange(BLOCK)).view(S, -1)[:, :T].reshape(-1)
        return AttentionMetadata(slot_mapping=slots, query_start_loc=[i * T for i in range(S + 1)],
                                 seq_lens=[T] * S, block_tables=table, num_decodes=0)

    def _rotation(self, rope: int, S: int):
        """The rotation of S sequences for a layer whose config.rope is `rope` (-1: none, SmolLM3's NoPE)."""
        if rope < 0:
            return None
        cos, sin = self.tables[rope]
        return cos[: S * self.seq_len], sin[: S * self.seq_len]

    @torch.no_grad()
    def __call__(self, layer: LlamaDecoderLayer, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, T, d] (the residual stream entering the layer) -> the stream leaving it."""
        n, T, d = hidden.shape
        out = torch.empty_like(hidden)
        for s in range(0, n, self.batch):
            h = hidden[s:s + self.batch].to(self.dtype)
            S = h.shape[0]
            rotation = self._rotation(layer.rope, S)
            mlp, residual = layer(h.reshape(S * T, d), None, rotation, self.kv, self._meta(S))
            out[s:s + S] = (residual + mlp).view(S, T, d)
        return out

    @torch.no_grad()
    def inputs_of(self, layer: LlamaDecoderLayer, name: str, module: torch.nn.Module, hidden: torch.Tensor,
                  sink: Callable[[str, torch.Tensor], None], keep: list | None = None) -> None:
        """Hand the input rows of `module` (one of layer's linears) to sink(name, x), running each
        batch's forward only up to it: GPTQ's later groups need no more of the layer. keep: a
        list that gets each batch's input as the module read it (engine/quant/sequential.py)."""
        def reached(_m, args):
            if keep is not None:
                keep.append(args[0])
            sink(name, args[0].reshape(-1, args[0].shape[-1]).float())
            raise _Reached
        handle = module.register_forward_pre_hook(reached)
        try:
            for s in range(0, hidden.shape[0], self.batch):
                try:
                    self(layer, hidden[s:s + self.batch])
                except _Reached:
                    pass
        finally:
            handle.remove()

    @torch.no_grad()
    def attention(self, attn: LlamaAttention, x: torch.Tensor, rope: int = 0) -> torch.Tensor:
        """x [n, T, d] (the normed stream q/k/v read) -> the attention block's output [n, T, d];
        rope: the layer's config.rope (-1: it turns no q and k)."""
        n, T, d = x.shape
        out = torch.empty_like(x)  # o_proj maps back to the hidden size
        for s in range(0, n, self.batch):
            h = x[s:s + self.batch]
            S = h.shape[0]
            rotation = self._rotation(rope, S)
            out[s:s + S] = attn(h.reshape(S * T, d), rotation, self.kv, self._meta(S)).view(S, T, d)
        return out


class _Reached(Exception):
    """LayerRun.inputs_of's stop: the forward reached the linear whose input was asked for."""


def capture_inputs(layer: LlamaDecoderLayer, modules: dict[str, torch.nn.Module],
                   sink: Callable[[str, torch.Tensor], None]) -> list:
    """Forward hooks that hand each module's input rows [tokens, in] to sink(name, x); returns
    the handles (remove them when done)."""
    def hook(name):
        return lambda _m, args, _out: sink(name, args[0].reshape(-1, args[0].shape[-1]).float())
    return [m.register_forward_hook(hook(name)) for name, m in modules.items()]
