"""GPTQ's true-sequential passes over one layer with each sub-block's forward run once (issue 69).

GPTQ quantizes a layer's linears in order (q/k/v, o, gate/up, down), each on inputs computed
through the linears already quantized (pipeline.py). Run as a forward up to each linear plus one
for the layer's output, the attention block runs three times over and gate/up twice: 2.6 forwards
of the layer. Here a pass keeps the tensors o_proj and down_proj read (float64, per batch), and
later passes start from them: the attention block's forward becomes o_proj of its kept input (then
its kept output), the MLP's down_proj of its kept input. Those are the ops the full forward runs,
on the same tensors and weights, so every value has the same bits; the layer's other steps (norms,
residual adds) run as they are. One quantized forward in all.
"""
from __future__ import annotations

from typing import Callable

import torch

from engine.models.llama import LlamaDecoderLayer
from engine.quant.calibration import LayerRun


def linears(layer: LlamaDecoderLayer) -> dict[str, torch.nn.Module]:
    a, m = layer.self_attn, layer.mlp
    return {"qkv_proj": a.qkv_proj, "o_proj": a.o_proj, "gate_up_proj": m.gate_up_proj, "down_proj": m.down_proj}


class SequentialPasses:
    """The passes of one layer over the calibration stream `hidden`, in GROUPS order (the first,
    q/k/v's, is the float layer's own forward: pipeline.LayerQuantizer._capture)."""

    def __init__(self, run: LayerRun, hidden: torch.Tensor) -> None:
        self.run, self.hidden = run, hidden
        self.o_in: list[torch.Tensor] = []  # o_proj's input, per batch
        self.o_out: list[torch.Tensor] = []  # o_proj's output (quantized o_proj), per batch
        self.down_in: list[torch.Tensor] = []  # down_proj's input, per batch

    def inputs(self, layer: LlamaDecoderLayer, name: str, sink: Callable[[str, torch.Tensor], None]) -> None:
        """Hand linear `name`'s inputs to sink, through layer (whose earlier linears are quantized)."""
        keep = None
        if name == "o_proj":
            keep = self.o_in
        elif name == "gate_up_proj":
            self._attention_from_o_input(layer)
        elif name == "down_proj":
            self._attention_from_o_output(layer)
            keep = self.down_in
        self.run.inputs_of(layer, name, linears(layer)[name], self.hidden, sink, keep)

    def output(self, layer: LlamaDecoderLayer) -> torch.Tensor:
        """The stream leaving the layer (every linear quantized, as the down_proj pass left it)."""
        self._attention_from_o_output(layer)
        mlp, kept = layer.mlp, iter(self.down_in)
        mlp.forward = lambda _x: mlp.down_proj(next(kept))
        out = self.run(layer, self.hidden)
        self.o_out, self.down_in = [], []
        return out

    def _attention_from_o_input(self, layer: LlamaDecoderLayer) -> None:
        attn, kept, self.o_out = layer.self_attn, iter(self.o_in), []

        def forward(*_args):
            y = attn.o_proj(next(kept))
            self.o_out.append(y)
            return y
        attn.forward = forward
        self.o_in = []  # the iterator holds them until the pass is done

    def _attention_from_o_output(self, layer: LlamaDecoderLayer) -> None:
        kept = iter(self.o_out)
        layer.self_attn.forward = lambda *_args: next(kept)
