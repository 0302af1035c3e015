"""`ember quantize` on Gemma 3 (issue 38): a tiny random Gemma 3 GGUF (tests/arch_ggufs.py, norms
jittered, 5 sliding layers then a global one) goes through RTN, GPTQ and AWQ to a Hugging Face
`gemma3_text` checkpoint under Hugging Face's names and norm convention, which Ember loads, dense
and on the kernels, as the file's model within 8-bit rounding.

Calibration samples are 70 tokens, past the file's 32-token window, so the calibration forward
slides the local layers as the engine does (and turns them at their own RoPE base)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

from arch_ggufs import write_arch_gguf
from engine.loaders.gguf_loader import load_model
from engine.loaders.load import load_model as load_any
from engine.model_files import families
from model_oracles import our_logits
from quantize_family_util import assert_runs_as_the_file, max_rel, quantize, tokens

pytestmark = pytest.mark.usefixtures("one_torch_thread")
@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma3")
    path = d / "gemma3.gguf"
    write_arch_gguf(path, "gemma3", seed=6, norm_jitter=0.2, pre="qwen2")
    (d / "calibration.txt").write_text("hello there, the one and the other, " * 60)
    return path


@pytest.mark.parametrize("method", ["rtn", "gptq", "awq"])
def test_a_gemma3_gguf_quantizes_to_a_checkpoint_ember_runs_as_the_file(gguf, tmp_path, method):
    out = tmp_path / "out"
    quantize(gguf, out, method)
    assert_runs_as_the_file(gguf, out)


def test_the_checkpoint_has_hugging_faces_gemma3_names_and_keys(gguf, tmp_path):
    out = tmp_path / "out"
    quantize(gguf, out, "rtn")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    assert (config["sliding_window"], config["rope_theta"], config["rope_local_base_freq"]) == (32, 1e6, 1e4)
    assert (config["head_dim"], config["query_pre_attn_scalar"], config["hidden_activation"]) == (16, 16, "gelu_pytorch_tanh")
    assert config["final_logit_softcapping"] is None and config["attn_logit_softcapping"] is None
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        p = "model.layers.0."
        for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm"):
            assert p + norm + ".weight" in names
        assert p + "self_attn.q_proj.qweight" in names and "lm_head.weight" not in names  # tied
        # Hugging Face's Gemma norm is x * (1 + w): the file's 1 + w (about 1) is stored as w (about 0)
        assert abs(float(f.get_tensor("model.norm.weight").float().mean())) < 0.2
    from gguf import GGUFReader

    post_attn = next(t for t in GGUFReader(str(gguf)).tensors if t.name == "blk.0.post_attention_norm.weight")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        stored = f.get_tensor(p + "post_attention_layernorm.weight").float()
    torch.testing.assert_close(stored, torch.from_numpy(np.array(post_attn.data)) - 1, atol=1e-3, rtol=0)


def test_without_the_norm_offset_the_checkpoint_is_another_model(gguf, tmp_path, monkeypatch):
    """Written with the GGUF's 1 + w as it stands, Hugging Face's (1 + w) norm (and Ember's loader
    of it) reads 2 + w: the logits move by far more than the rounding."""
    with monkeypatch.context() as m:
        m.setitem(families.FAMILIES, "gemma3", dataclasses.replace(families.FAMILIES["gemma3"], hf_norm_offset=0.0))
        quantize(gguf, tmp_path / "plain", "rtn")
    quantize(gguf, tmp_path / "gemma", "rtn")
    want = our_logits(load_model(gguf), tokens())
    right = max_rel(our_logits(load_any(tmp_path / "gemma", torch.float32, "cpu"), tokens()), want)
    wrong = max_rel(our_logits(load_any(tmp_path / "plain", torch.float32, "cpu"), tokens()), want)
    assert right < 3e-2 and wrong > 10 * right, (right, wrong)
