"""`ember quantize` on Phi-3 / Phi-4-mini (issue 38): a tiny random phi3 GGUF shaped like
Phi-4-mini (RoPE turns 12 of each head's 16 dims, LongRoPE factor sets with an original context of
a quarter of the context, fused attn_qkv and gate|up ffn_up) goes through RTN, GPTQ and AWQ to a
Hugging Face `phi3` checkpoint (Phi3ForCausalLM's fused qkv_proj and gate_up_proj,
partial_rotary_factor, rope_scaling longrope), which Ember loads, dense and on the kernels, as the
file's model within 8-bit rounding; the calibration forward is the engine's own."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

from arch_ggufs import write_arch_gguf
from engine.loaders.gguf_loader import load_model
from engine.loaders.load import load_model as load_any
from engine.models.llama import LlamaDecoderLayer
from engine.quant.calibration import LayerRun
from engine.quant.pipeline import fused_take
from engine.quant.source import layer_weights, open_source
from model_oracles import our_logits
from quantize_family_util import T, assert_runs_as_the_file, max_rel, tokens
from quantize_family_util import quantize as quantize_tiny

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROPE_DIM = 12  # of head_dim 16, as Phi-4-mini turns 3/4 of each head


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    d = tmp_path_factory.mktemp("phi3")
    path = d / "phi3.gguf"
    write_arch_gguf(path, "phi3", seed=4, rope_dim=ROPE_DIM, longrope=True, norm_jitter=0.2, pre="qwen2")
    (d / "calibration.txt").write_text("hello there, the one and the other, " * 60)
    return path


def quantize(gguf, out, method: str) -> None:
    """method: rtn, gptq, awq, or gptq-desc-act (act-order: q, k and v share one Hessian, so
    one column order, and stack into qkv_proj)."""
    method, _, act_order = method.partition("-")
    quantize_tiny(gguf, out, method, *(["--desc-act"] if act_order else []))


def test_the_calibration_forward_is_the_engines(gguf):
    """Layer by layer from the source's Hugging Face tensors (q|k|v split out of attn_qkv, the
    partial rotary's dims moved, LongRoPE's short set at a sample's length), then the final norm
    and head: the logits the engine computes from the file."""
    src = open_source(gguf)
    cfg = src.config
    ids = torch.tensor([tokens()])
    hidden = torch.nn.functional.embedding(ids, src.tensor("model.embed_tokens.weight"))
    run = LayerRun(cfg, T, batch=1, rope_factors=src.rope_factors())
    for i in range(cfg.num_layers):
        hidden = run(LlamaDecoderLayer(cfg, i, fused_take(cfg, layer_weights(src, i))).eval(), hidden)
    x = hidden[0]
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * src.tensor("model.norm.weight")
    logits = x @ src.tensor("lm_head.weight").T
    assert max_rel(logits, our_logits(load_model(gguf), tokens())) < 1e-5


@pytest.mark.parametrize("method", ["rtn", "gptq", "awq", "gptq-desc-act"])
def test_a_phi3_gguf_quantizes_to_a_checkpoint_ember_runs_as_the_file(gguf, tmp_path, method):
    out = tmp_path / "out"
    quantize(gguf, out, method)
    assert_runs_as_the_file(gguf, out)


def test_the_checkpoint_has_hugging_faces_phi3_names_and_keys(gguf, tmp_path):
    out = tmp_path / "out"
    quantize(gguf, out, "rtn")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "phi3" and config["architectures"] == ["Phi3ForCausalLM"]
    assert config["partial_rotary_factor"] == 0.75 and config["sliding_window"] is None
    assert config["hidden_act"] == "silu" and config["original_max_position_embeddings"] == 1024
    rs = config["rope_scaling"]
    assert rs["type"] == rs["rope_type"] == "longrope" and rs["original_max_position_embeddings"] == 1024
    assert rs["attention_factor"] == pytest.approx(np.sqrt(1 + np.log(4) / np.log(1024)), rel=1e-6)
    from gguf import GGUFReader

    file = {t.name: np.array(t.data) for t in GGUFReader(str(gguf)).tensors}
    assert rs["short_factor"] == file["rope_factors_short.weight"].tolist()  # float32 values exactly
    assert rs["long_factor"] == file["rope_factors_long.weight"].tolist()
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    p = "model.layers.0."
    for module in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        assert p + module + ".qweight" in names and p + module + ".scales" in names
    assert not any(".q_proj." in n or ".gate_proj." in n or ".up_proj." in n for n in names)
    assert "lm_head.weight" in names  # Phi-3 has its own head
    # beyond the original context both take the long factors, and agree there too
    model, dense = load_model(gguf), load_any(out, torch.float32, "cpu")
    for m in (model, dense):
        m.use_context(2048)
    long = our_logits(model, tokens())
    assert max_rel(our_logits(dense, tokens()), long) < 3e-2
    assert max_rel(long, our_logits(load_model(gguf), tokens())) > 1e-3  # and they are other logits
