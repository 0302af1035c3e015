"""`ember quantize`: a model (GGUF or float safetensors) -> a GPTQ/AWQ/compressed-tensors directory.

Layer by layer, so memory holds one layer's weights and the calibration stream [n, T, d]:
  RTN   each linear rounded to the nearest code of its group (no calibration);
  GPTQ  true-sequential (Frantar et al.; AutoGPTQ's order): q/k/v on the layer's input, then
        o_proj on the attention output of the already-quantized q/k/v, then gate/up, then
        down, each from the Hessian of its own input (engine/quant/gptq.py);
  AWQ   activation-aware scales per input channel (Lin et al.; engine/quant/awq.py) searched on
        the layer's float inputs (q/k/v's on the attention block's output error, the others
        on their own) and folded into the op before the linear: the input norm for
        q/k/v and gate/up, up_proj's rows for down_proj, v_proj's rows for o_proj (only when
        they have the same width, i.e. no GQA, as AutoAWQ does), then RTN. AutoAWQ's clip
        search is opt-in (awq_clip): it lowers the calibration error, but on Qwen2.5-Coder-0.5B
        g128 it raised held-out perplexity (docs 8.52 -> 8.64, corpus 14.31 -> 15.26), while on
        SmolLM2-135M it lowered it (13.95 -> 13.66, 18.78 -> 17.70).
GPTQ's next layer is calibrated on this layer's output computed with the quantized weights (its
error feedback continues across layers); AWQ's on the float output, as AutoAWQ does.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from engine.loaders.gguf_loader import ROTARY_ROWS, rotary_rows
from engine.loaders.weight_names import FUSED, hf_norms
from engine.models.config import ModelConfig
from engine.models.llama import LlamaDecoderLayer
from engine.quant.calibration import LayerRun, capture_inputs, default_calibration_text, samples
from engine.quant.quantize_config import Method, QuantizeConfig
from engine.quant.rtn_guard import Split, Tally, held_out, keep_better
from engine.quant.sequential import SequentialPasses, linears
from engine.quant.source import Source, layer_weights
from engine.weights.int_weight import IntWeight

log = logging.getLogger(__name__)

# (our fused linear, the Hugging Face modules it is made of), in true-sequential order
GROUPS = tuple((name, hf) for name, (_, hf) in FUSED.items())


# AutoAWQ does not clip q and k: their error reaches the output through softmax(q k^T), which the
# per-linear clip objective does not see.
NO_CLIP = ("self_attn.q_proj", "self_attn.k_proj")


@dataclass
class LayerResult:
    weights: dict[str, IntWeight]  # Hugging Face module -> its quantized weight
    dense: dict[str, torch.Tensor]  # norms and biases (AWQ: with its scales folded in)


@dataclass
class Report:
    layers: int
    seconds: float
    calibration_tokens: int
    output_error: list[float] = field(default_factory=list)  # per layer, relative, on calibration
    heldout: Tally | None = None  # GPTQ: held-out output errors against RTN's (rtn_guard.py)


Progress = Callable[[int, int, str], None]  # (layers done, layers, what is running)


def fused_take(config: ModelConfig, W: dict[str, torch.Tensor]):
    """Our weight names for one layer (engine/models/llama.py) from Hugging Face module tensors;
    a partial rotary's q/k rows moved as the loaders move them (gguf_loader.rotary_rows)."""
    norms = hf_norms(config.family)

    def fetch(leaf: str):
        name, _, kind = leaf.rpartition(".")
        if name in norms:
            return W[f"{norms[name]}.weight"]
        modules = dict(GROUPS)[name]
        if kind == "bias":
            return torch.cat([W[f"{m}.bias"] for m in modules]) if config.attention_bias else None
        return torch.cat([W[f"{m}.weight"] for m in modules])

    def take(key: str):
        leaf = key.split(".", 2)[2]
        w = fetch(leaf)
        if w is not None and config.rotary_dim and leaf in ROTARY_ROWS:
            w = w[rotary_rows(config, leaf)]
        return w
    return take


def calibration_text(src: Source, cfg: QuantizeConfig) -> str:
    """The file's text, else the standard library's interleaved with the model's own replies
    (one reply per two samples: about half the calibration tokens)."""
    if cfg.calibration:
        return cfg.calibration.read_text(encoding="utf-8")
    if not cfg.self_calibration:
        return default_calibration_text()
    from engine.quant.self_calibration import calibration_replies, interleave

    own = calibration_replies(src.path, -(-cfg.num_samples // 2), max_tokens=max(cfg.seq_len, 256))
    return interleave(own, default_calibration_text())


def calibration_ids(src: Source, cfg: QuantizeConfig) -> torch.Tensor:
    from engine.loaders.tokenizer import load_tokenizer

    text = calibration_text(src, cfg)
    need = cfg.num_samples * cfg.seq_len
    tok = load_tokenizer(src.path)
    try:  # tokenize only as much of the text as the samples take (a token is rarely 6+ characters)
        chars = need * 6
        while True:
            ids = tok.encode(text[:chars], add_bos=False, parse_special=False)
            if len(ids) >= need or chars >= len(text):
                break
            chars *= 2
    finally:
        tok.close()
    return samples(ids, cfg.num_samples, cfg.seq_len)


class LayerQuantizer:
    """Quantizes one layer at a time and carries the calibration stream to the next."""

    def __init__(self, config: ModelConfig, cfg: QuantizeConfig, hidden: torch.Tensor | None,
                 rope_factors: dict[str, torch.Tensor] | None = None) -> None:
        self.config, self.cfg, self.hidden = config, cfg, hidden
        # GPTQ's forward in float64, rounded to float32 between layers and at the captured inputs:
        # the same stream on every CPU (calibration.LayerRun.dtype, gptq.py)
        self.dtype = torch.float64 if cfg.method is Method.GPTQ else torch.float32
        self.tally = Tally()
        self.run = None if hidden is None else LayerRun(config, hidden.shape[1], rope_factors=rope_factors or {},
                                                        dtype=self.dtype)

    def layer(self, i: int, W: dict[str, torch.Tensor]) -> LlamaDecoderLayer:
        weights = {k: v.float().to(self.dtype) for k, v in W.items()}
        return LlamaDecoderLayer(self.config, i, fused_take(self.config, weights)).eval()

    def __call__(self, i: int, W: dict[str, torch.Tensor]) -> tuple[LayerResult, float]:
        method = self.cfg.method
        self._float_out = None  # the float layer's output, when a method's first pass computed it
        self._passes = None  # GPTQ's passes, which end with the quantized layer's output
        if method is Method.RTN:
            result = self._rtn(W)
        elif method is Method.GPTQ:
            result = self._gptq(i, W)
        else:
            result = self._awq(i, W)
        err = 0.0
        if self.hidden is not None:  # the next layer's input, through the quantized weights
            ref = self._float_out if self._float_out is not None else self.run(self.layer(i, W), self.hidden)
            Wq = dict(result.dense) | {f"{m}.weight": w.dequantize() for m, w in result.weights.items()}
            layer = self.layer(i, Wq)
            out = self._passes.output(layer) if self._passes else self.run(layer, self.hidden)
            err = float((out - ref).norm() / ref.norm())  # what this layer's rounding costs, on its input
            self.hidden = ref if method is Method.AWQ else out
        return result, err

    def _capture(self, layer: LlamaDecoderLayer, names: list[str], sink: Callable[[str, torch.Tensor], None]
                 ) -> torch.Tensor:
        """Run the layer over the stream, handing the inputs of its linears `names` to sink."""
        handles = capture_inputs(layer, {n: linears(layer)[n] for n in names}, sink)
        try:
            return self.run(layer, self.hidden)
        finally:
            for h in handles:
                h.remove()

    def _dense(self, W: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v for k, v in W.items() if not k.endswith("proj.weight")}

    def _rtn(self, W: dict[str, torch.Tensor]) -> LayerResult:
        from engine.weights.rtn import rtn

        c = self.cfg
        return LayerResult({m: rtn(W[f"{m}.weight"], c.bits, c.group_size, c.sym)
                            for _, ms in GROUPS for m in ms}, self._dense(W))

    def _gptq(self, i: int, W: dict[str, torch.Tensor]) -> LayerResult:
        from engine.quant.gptq import GPTQ

        c, W, out, layer = self.cfg, dict(W), {}, Tally()
        n, T = self.hidden.shape[:2]
        self._passes = SequentialPasses(self.run, self.hidden)
        for name, modules in GROUPS:
            g = GPTQ(W[f"{modules[0]}.weight"].shape[1])
            split = Split((n - held_out(n)) * T, g.add_batch)  # the last samples: held out
            if out:  # the forward only up to this group's linear, from the last pass's tensors
                self._passes.inputs(self.layer(i, W), name, split)
            else:  # nothing rounded yet: this pass is the float layer's, its output the reference
                self._float_out = self._capture(self.layer(i, W), [name], split)
            held = split.held()
            for m in modules:  # q, k, v (and gate, up) share one input, so one Hessian
                out[m] = g.quantize(W[f"{m}.weight"], c.bits, c.group_size, c.sym, c.desc_act, c.damp,
                                    static_groups=c.static_groups, mse=c.mse_scales)
                if held is not None:  # each row GPTQ's or RTN's, whichever errs less on held-out rows
                    out[m], t = keep_better(W[f"{m}.weight"], out[m], held, c.sym)
                    layer.add(t)
                W[f"{m}.weight"] = out[m].dequantize()
        log.info("layer %d: GPTQ kept on %d rows, RTN on %d", i, layer.rows_gptq, layer.rows_rtn)
        self.tally.add(layer)
        return LayerResult(out, self._dense(W))

    def _attention_loss(self, i: int, W: dict[str, torch.Tensor], x: torch.Tensor):
        """AWQ's loss for q/k/v (awq.py): the squared error of the attention block's output, o_proj
        float, on the captured inputs x [tokens, d], given q/k/v's effective weights."""
        from engine.models.llama import LlamaAttention

        attn_w = {k: v.float() for k, v in W.items() if k.startswith("self_attn.")}
        xa = x.view(self.hidden.shape[0], -1, x.shape[-1])
        modules = dict(GROUPS)["qkv_proj"]

        def block(effective: list[torch.Tensor]) -> torch.Tensor:
            weights = attn_w | {f"{m}.weight": e for m, e in zip(modules, effective)}
            attn = LlamaAttention(self.config, f"layers.{i}.", fused_take(self.config, weights), self.config.window(i))
            return self.run.attention(attn, xa, self.config.rope(i))

        ref = block([attn_w[f"{m}.weight"] for m in modules])
        return lambda effective: float(((block(effective) - ref) ** 2).sum())

    def _awq(self, i: int, W: dict[str, torch.Tensor]) -> LayerResult:
        from engine.quant.awq import awq_quantize, search_clip, search_scales

        c, W, cfgm = self.cfg, dict(W), self.config
        X: dict[str, list[torch.Tensor]] = {name: [] for name, _ in GROUPS}
        self._float_out = self._capture(self.layer(i, W), list(X), lambda n, x: X[n].append(x))
        x = {n: torch.cat(v) for n, v in X.items()}
        # (group, the op before it whose output channels absorb 1/s); the norms by the family's names
        norms = hf_norms(cfgm.family)
        before = {"qkv_proj": f"{norms['input_layernorm']}.weight",
                  "gate_up_proj": f"{norms['post_attention_layernorm']}.weight",
                  "down_proj": "mlp.up_proj", "o_proj": "self_attn.v_proj" if cfgm.q_size == cfgm.kv_size else None}
        # Every scale is searched on the float inputs and folded before anything is rounded:
        # down_proj's 1/s lands in up_proj's rows, which must not be quantized yet.
        scales = {}
        for name, modules in GROUPS:
            prev = before[name]
            if prev is None:
                continue
            loss = self._attention_loss(i, W, x[name]) if name == "qkv_proj" else None
            s = scales[name] = search_scales(x[name], [W[f"{m}.weight"] for m in modules], c.bits,
                                             c.group_size, c.sym, loss=loss)
            if prev.endswith("norm.weight"):
                W[prev] = W[prev] / s
            else:  # a linear's output rows (and bias): its output is this group's input
                W[f"{prev}.weight"] = W[f"{prev}.weight"] / s[:, None]
                if f"{prev}.bias" in W:
                    W[f"{prev}.bias"] = W[f"{prev}.bias"] / s
            for m in modules:
                W[f"{m}.weight"] = W[f"{m}.weight"] * s
        out = {}
        for name, modules in GROUPS:
            xs = x[name] / scales[name] if name in scales else x[name]
            for m in modules:
                w = W[f"{m}.weight"]
                if c.awq_clip and m not in NO_CLIP:
                    w = search_clip(xs, w, c.bits, c.group_size, c.sym)
                out[m] = awq_quantize(w, c.bits, c.group_size, c.sym)
        return LayerResult(out, self._dense(W))


def quantize_model(src: Source, cfg: QuantizeConfig, on_layer: Callable[[int, LayerResult], None],
                   progress: Progress | None = None) -> Report:
    """Quantize every layer of `src`, handing each result to on_layer(i, result) (the writer)."""
    cfg.check()
    t0 = time.monotonic()
    n_layers = src.config.num_layers
    hidden = None
    if cfg.method is not Method.RTN:
        if progress:
            progress(0, n_layers, "writing calibration text" if cfg.calibration is None and cfg.self_calibration
                     else "tokenizing the calibration text")
        ids = calibration_ids(src, cfg)
        hidden = torch.nn.functional.embedding(ids, src.tensor("model.embed_tokens.weight"))
        if src.config.embed_scale != 1.0:  # Gemma's sqrt(hidden), in float32 as the engine's embed
            hidden = hidden * src.config.embed_scale
    q = LayerQuantizer(src.config, cfg, hidden, src.rope_factors())
    report = Report(n_layers, 0.0, 0 if hidden is None else hidden.shape[0] * hidden.shape[1])
    for i in range(n_layers):
        if progress:
            progress(i, n_layers, f"layer {i + 1}/{n_layers}")
        result, err = q(i, layer_weights(src, i))
        report.output_error.append(err)
        on_layer(i, result)
    if q.tally.reference:
        report.heldout = q.tally
    report.seconds = time.monotonic() - t0
    if progress:
        progress(n_layers, n_layers, "done")
    return report
