"""`ember quantize` from a float safetensors folder (the other kind of SRC): a Hugging Face
checkpoint of a tiny model, written here from a GGUF's dequantized weights in float16 (with the
GGUF's tokenizer as tokenizer.json), is read through the same loader as any folder; a float folder
also runs as it is; and quantizing it gives the same checkpoint as quantizing the GGUF itself."""
from __future__ import annotations

import inspect
import json
import textwrap
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as QT
from safetensors.torch import load_file, save_file

from app.cli import main
from engine.loaders.gguf_vocab import write_hf_tokenizer
from engine.loaders.load import load_model
from engine.quant.perplexity import perplexity
from engine.quant.source import LINEARS, open_source


def float_folder(gguf: Path, out: Path) -> Path:
    """The GGUF as a float16 Hugging Face folder (config.json without quantization_config)."""
    src = open_source(gguf)
    c = src.config
    names = ["model.embed_tokens.weight", "model.norm.weight"] + ([] if c.tie_word_embeddings else ["lm_head.weight"])
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        names += [f"{p}{m}.weight" for m in LINEARS]
        names += [f"{p}input_layernorm.weight", f"{p}post_attention_layernorm.weight"]
        if c.attention_bias:
            names += [f"{p}self_attn.{x}_proj.bias" for x in "qkv"]
    out.mkdir()
    # matrices float16 (the GGUF's own F16 values), norms and biases float32 as the GGUF holds them
    save_file({n: (src.tensor(n).half() if n.endswith("proj.weight") or "embed" in n or "lm_head" in n
                   else src.tensor(n)).contiguous() for n in names}, str(out / "model.safetensors"))
    config = {"model_type": c.arch, "architectures": ["LlamaForCausalLM" if c.arch == "llama" else "Qwen2ForCausalLM"],
              "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
              "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
              "num_key_value_heads": c.num_kv_heads, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
              "max_position_embeddings": c.context_length, "tie_word_embeddings": c.tie_word_embeddings,
              "torch_dtype": "float16"}
    (out / "config.json").write_text(json.dumps(config))
    write_hf_tokenizer(gguf, out)
    return out


@pytest.fixture
def calibration(tmp_path) -> Path:
    path = tmp_path / "calibration.txt"
    path.write_text(inspect.getsource(textwrap)[:6000], encoding="utf-8")
    return path


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_float_folder_quantizes_like_the_gguf_it_holds(tiny_model_factory, tmp_path, calibration, arch):
    torch.set_num_threads(1)
    gguf = tiny_model_factory(arch=arch, hidden=128, ffn=256, n_heads=4, n_kv_heads=2, qtype=QT.F16)
    folder = float_folder(gguf, tmp_path / "float")
    # the float folder runs as it is, exactly as the GGUF (the same values, the same code)
    seq = list(range(3, 67))
    assert perplexity(load_model(folder), seq, window=64) == perplexity(load_model(gguf), seq, window=64)
    flags = ["--method", "gptq", "--samples", "2", "--seq-len", "64", "--calibration", str(calibration), "--no-progress"]
    assert main(["quantize", str(folder), str(tmp_path / "from-folder"), *flags]) == 0
    assert main(["quantize", str(gguf), str(tmp_path / "from-gguf"), *flags]) == 0
    x, y = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("from-folder", "from-gguf"))
    assert x.keys() == y.keys()
    for name in x:
        assert torch.equal(x[name], y[name]), name
    assert main(["quantize", str(tmp_path / "from-gguf"), str(tmp_path / "again"), *flags]) != 0  # already quantized
