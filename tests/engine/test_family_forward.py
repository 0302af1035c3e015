"""Every family Ember's own engine runs (engine/model_files/families.py), on a tiny random GGUF in
the family's real layout (tests/arch_ggufs.py, norms jittered so a norm read in the wrong place
shows): float32 logits against llama.cpp's on the same file and against a float64 forward
written from llama.cpp's graphs (tests/model_oracles.py); chunked prefill and paged decode
against one whole prefill; the C++ decoder stack against the Python layers on every CPU path
this machine has; and `auto` choosing Ember's engine for a quantized file of each family.

Sequences are 70 tokens: past Gemma 3's 32-token test window, so its local layers slide.
SmolLM3 gets 4 layers, so its RoPE-less 4th layer is there.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from arch_ggufs import vocab_size, write_arch_gguf
from engine.backends import load_engine
from engine.config import EngineConfig
from engine.kernels import available_paths, kernels
from engine.layers import attention as attn
from engine.loaders.gguf_loader import load_model
from engine.model_files.families import FAMILIES
from engine.sampling_params import SamplingParams
from model_oracles import (agreement, assert_agrees, decode_meta, kv_pool, llama_cpp_logits, llama_cpp_model,
                           our_logits, prefill_meta, reference_logits, summarize)

ARCHS = ["llama", "qwen3", "smollm3", "gemma3", "phi3"]
# qwen2: tests/engine/test_model_tiny.py's files; qwen3moe, qwen2moe (experts): tests/engine/test_moe_forward.py
assert set(ARCHS) == set(FAMILIES) - {"qwen2", "qwen3moe", "qwen2moe"}
LAYERS = {"smollm3": 4}
T = 70


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("families")

    def write(arch: str, qtype=None):
        path = d / f"{arch}-{qtype.name if qtype else 'f32'}.gguf"
        if not path.exists():
            write_arch_gguf(path, arch, seed=3, layers=LAYERS.get(arch), norm_jitter=0.2, qtype=qtype)
        return path
    return write


def _tokens(seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab_size(), size=T).tolist()


def _max_rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("arch", ARCHS)
def test_the_config_says_what_the_family_is(files, arch):
    c = load_model(files(arch)).config
    f = FAMILIES[arch]
    assert c.family == f
    if arch == "gemma3":  # 5 local layers (window 32, RoPE base 10,000), then a global one
        assert c.layer_windows == (32,) * 5 + (0,) and c.layer_rope == (1,) * 5 + (0,)
        assert c.rope_theta_local == 10000.0 and c.embed_scale == 8.0
    elif arch == "smollm3":  # every 4th layer has no RoPE
        assert c.layer_rope == (0, 0, 0, -1) and c.layer_windows == ()
    else:
        assert c.layer_rope == c.layer_windows == () and c.embed_scale == 1.0


@pytest.mark.parametrize("arch", ARCHS)
def test_float32_logits_match_llama_cpp_and_a_float64_forward(files, arch):
    path = files(arch)
    model = load_model(path)
    tokens = _tokens()
    ours = our_logits(model, tokens)
    ref = reference_logits(path, tokens)
    assert _max_rel(ours, ref) < 1e-5  # measured 1e-6 or less
    theirs = torch.from_numpy(llama_cpp_logits(llama_cpp_model(path, 128), tokens))
    # ggml's GELU reads a float16 table (measured 6e-4 of the logits' spread on gemma3); the
    # others agree with llama.cpp to float32 rounding
    assert _max_rel(ours, theirs) < (2e-3 if arch == "gemma3" else 1e-4)
    assert_agrees(summarize([agreement(ours[:-1], theirs[:-1], torch.tensor(tokens[1:]))]))


@torch.inference_mode()
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel", [True, False], ids=["decode-kernel", "sdpa-fallback"])
def test_chunked_prefill_and_paged_decode_match_one_prefill(files, arch, kernel, monkeypatch):
    if not kernel:
        monkeypatch.setattr(attn, "decode_kernel_available", lambda cache: False)
    model = load_model(files(arch))
    tokens = _tokens(1)
    whole = our_logits(model, tokens)
    torch.testing.assert_close(our_logits(model, tokens, chunk=13), whole, rtol=1e-5, atol=1e-5)
    caches = kv_pool(model, T)
    nb = caches[0][0].shape[0]
    ids = torch.tensor(tokens)
    n = 20  # prefill 20, then decode one token at a time across the window's edge
    model(ids[:n], torch.arange(n), caches, prefill_meta(0, n, nb))
    for pos in range(n, T):
        hidden = model(ids[pos:pos + 1], torch.tensor([pos]), caches, decode_meta(pos, nb))
        torch.testing.assert_close(model.compute_logits(hidden)[0], whole[pos], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(kernels() is None, reason="Ember's CPU kernels are not built")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0], ids=lambda q: q.name)
@pytest.mark.parametrize("path", available_paths() if kernels() is not None else [], ids=lambda p: p.name)
def test_the_decoder_stack_runs_each_family_as_the_python_layers_do(files, arch, qtype, path, monkeypatch):
    """One C++ op for the whole stack (engine/kernels/csrc/decoder.cpp), fed the family's switches,
    against the Python layers over the same quantized linears on this CPU path. The two sum in
    other orders (1e-7 apart), and where that moves an activation across an int8 rounding step
    the rows after it differ by about one step (measured 2e-2 on gemma3, whose post-norms
    amplify it); a wrong switch (a norm, the activation, a window, a RoPE table) is O(1)."""
    monkeypatch.setenv("EMBER_CPU_PATH", path.name.lower())
    file = files(arch, qtype)
    model = load_model(file, quantized=True)
    assert model.stack is not None
    tokens = _tokens(2)
    stacked = our_logits(model, tokens, chunk=29)
    model.stack = None
    layered = our_logits(model, tokens, chunk=29)
    assert _max_rel(stacked, layered) < 5e-2
    assert_agrees(summarize([agreement(stacked[:-1], layered[:-1], torch.tensor(tokens[1:]))]))
    # and the quantized model is the file's model but for int8 activations (measured up to 5.5e-2,
    # Q4_0 gemma3; dropping the window alone moves these logits by 0.35-0.8)
    assert _max_rel(stacked, reference_logits(file, tokens)) < 1e-1


@pytest.mark.skipif(kernels() is None, reason="Ember's CPU kernels are not built")
@pytest.mark.parametrize("arch", ARCHS)
def test_auto_runs_each_family_on_embers_engine(files, arch):
    engine, decision = load_engine(EngineConfig(model_path=str(files(arch, QT.Q8_0)), num_threads=1,
                                                max_model_len=128))
    try:
        assert decision.backend == "torch" and "Ember's kernels" in decision.reason, decision.reason
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
        (out,) = engine.generate(["hello there, the one"], params)
        assert len(out.output_token_ids) == 40 and out.finish_reason == "length"
    finally:
        engine.close()


@pytest.mark.parametrize("rope_dim,longrope", [(12, False), (16, True), (12, True)],
                         ids=["partial-rotary", "longrope", "phi4-mini-like"])
def test_phi_partial_rotary_and_longrope_match_llama_cpp(tmp_path, rope_dim, longrope):
    """Phi-4-mini turns 3/4 of each head and, like Phi-3's 128k models, divides its frequencies by
    LongRoPE factors and scales cos and sin by attn_factor; llama.cpp at a context within the
    original one takes the short factors, and so does Ember's model at that context."""
    path = tmp_path / "phi.gguf"
    write_arch_gguf(path, "phi3", seed=4, rope_dim=rope_dim, longrope=longrope, norm_jitter=0.2)
    model = load_model(path)
    assert model.config.rotary_dim == (rope_dim if rope_dim < 16 else 0)
    tokens = _tokens(3)
    ours = our_logits(model, tokens)
    assert _max_rel(ours, reference_logits(path, tokens)) < 1e-5
    assert _max_rel(ours, llama_cpp_logits(llama_cpp_model(path, 128), tokens)) < 1e-4
    if longrope:  # beyond the original context, the long factors: other logits
        model.use_context(model.config.rope_original_context + 1)
        assert _max_rel(our_logits(model, tokens), ours) > 1e-3
    qmodel = load_model(write_quantized(tmp_path, rope_dim, longrope), quantized=True)
    assert qmodel.stack is not None  # and the C++ stack takes the same tables
    stacked = our_logits(qmodel, tokens)
    qmodel.stack = None
    assert _max_rel(stacked, our_logits(qmodel, tokens)) < 5e-2


def write_quantized(tmp_path, rope_dim, longrope):
    path = tmp_path / "phi-q8.gguf"
    write_arch_gguf(path, "phi3", seed=4, rope_dim=rope_dim, longrope=longrope, norm_jitter=0.2, qtype=QT.Q8_0)
    return path



@pytest.mark.parametrize("arch,method", [("qwen3", "rtn"), ("qwen3", "gptq"), ("qwen3", "awq"), ("smollm3", "gptq"),
                                         ("smollm3", "awq")])
def test_ember_quantize_takes_a_family_gguf_to_a_checkpoint_ember_loads(tmp_path, arch, method):
    """`ember quantize` on a Qwen3 GGUF (its q/k norms carried through the calibration forward
    and written as float16 tensors under Hugging Face's names) and a SmolLM3 one (its NoPE layer
    run without RoPE in calibration, listed in config.json's no_rope_layers): the checkpoint
    loads, dense and on the kernels, as the file's model within 8-bit rounding."""
    from app.cli import main
    from engine.loaders.load import load_model as load_any

    src, out = tmp_path / f"{arch}.gguf", tmp_path / "out"
    write_arch_gguf(src, arch, seed=6, norm_jitter=0.2, pre="qwen2", layers=LAYERS.get(arch))
    calibration = tmp_path / "calibration.txt"
    calibration.write_text("hello there, the one and the other, " * 40)
    assert main(["quantize", str(src), str(out), "--method", method, "--format", "gptq", "--bits", "8",
                 "--group-size", "32", "--samples", "2", "--seq-len", "32", "--calibration", str(calibration),
                 "--no-progress"]) == 0
    tokens = _tokens(5)
    want = our_logits(load_model(src), tokens)
    dense = load_any(out, torch.float32, "cpu")
    assert dense.config.arch == arch and dense.config.family.qk_norm == (arch == "qwen3")
    assert dense.config.layer_rope == ((0, 0, 0, -1) if arch == "smollm3" else ())
    assert _max_rel(our_logits(dense, tokens), want) < 3e-2  # 8-bit weights (float16 norms)
    if kernels() is not None:
        assert _max_rel(our_logits(load_any(out, torch.float32, "cpu", quantized=True), tokens), want) < 6e-2
