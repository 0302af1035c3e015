"""The mixture-of-experts families on Ember's own engine (engine/layers/moe.py): qwen3moe, and
qwen2moe (top-k weights not renormalised, and a shared expert every token takes, scaled by a
sigmoid gate), on tiny random GGUFs in their real layout (tests/arch_ggufs.py: 4 experts, 2 per
token, norms jittered): float32 logits against llama.cpp's and against a float64 forward (tests/moe_oracle.py);
the experts on Ember's kernels, in the file's Q8_0 and Q4_0, against llama.cpp under the
fidelity bar; chunked prefill and paged decode against one prefill; a sequence's logits bit for
bit the same alone and in a batch whose other rows take other experts; and `auto` choosing
Ember's engine for a quantized file (and for one in the layout llama.cpp's own quantizer makes:
Q4_K_M experts, an F32 router), its logged reason naming the runner and the bytes a token
reads of the whole file the fit counts. On the kernels the native decoder stack runs it
(engine/kernels/csrc/moe.cpp), against the Python layers on every CPU path.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from arch_ggufs import K_QUANT_READY, vocab_size, write_arch_gguf
from engine.backends import decide, load_engine, model_footprint
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.kernels import available_paths, kernels
from engine.layers.attention import AttentionMetadata
from engine.layers.quant_linear import QuantLinear
from engine.loaders.gguf_loader import load_model
from engine.model_files.families import FAMILIES
from engine.model_files.fit import MOE_NATIVE, MOE_ON_LLAMA_CPP, MachineInfo, choose_backend
from engine.model_files.footprint import GiB, RUNTIME_OVERHEAD_BYTES, kv_bytes_per_token
from engine.model_files.gguf_file import GGUFFile
from engine.sampling_params import SamplingParams
from engine_helpers import run_staggered
from model_oracles import (BLOCK, MEAN_KL_MAX, TOP1_MIN, agreement, assert_agrees, decode_meta, format_summary,
                           kv_pool, llama_cpp_logits, llama_cpp_model, near_ties_ok, our_logits, prefill_meta,
                           reference_logits, summarize)

T = 70
needs_kernels = pytest.mark.skipif(kernels() is None, reason="Ember's CPU kernels are not built")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe")

    def write(qtype=None, arch="qwen3moe"):
        path = d / f"{arch}-{qtype.name if qtype else 'f32'}.gguf"
        if not path.exists():
            write_arch_gguf(path, arch, seed=3, norm_jitter=0.2, qtype=qtype)
        return path
    return write


ARCHS = pytest.mark.parametrize("arch", ["qwen3moe", "qwen2moe"])


def _tokens(seed: int = 0, n: int = T) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab_size(), size=n).tolist()


def _max_rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_the_config_reads_the_experts_and_the_native_stack_runs_them(files):
    model = load_model(files(QT.Q8_0), quantized=True)
    c = model.config
    assert c.family == FAMILIES["qwen3moe"] and c.family.moe.norm_top_k and c.family.qk_norm
    assert (c.num_experts, c.num_experts_used, c.expert_intermediate_size) == (4, 2, 32)
    assert (model.stack is not None) == (kernels() is not None)  # decoder.cpp routes: one op for the stack
    mlp = model.layers[0].mlp
    assert len(mlp.gate_up) == len(mlp.down) == 4
    assert (mlp.router_weight if mlp.router is None else mlp.router.weight).shape[0] == 4
    if kernels() is not None:  # each expert's slice of the stacked tensors, in the file's Q8_0
        assert all(isinstance(lin, QuantLinear) and lin.bits == 8 for lin in (*mlp.gate_up, *mlp.down))
        assert (mlp.gate_up[0].out_features, mlp.down[0].out_features) == (64, 64)


@needs_kernels
def test_qwen2moe_reads_its_shared_expert_and_the_native_stack_runs_it(files):
    model = load_model(files(QT.Q8_0, "qwen2moe"), quantized=True)
    c = model.config
    assert c.family.moe.shared_expert and not c.family.moe.norm_top_k and c.attention_bias
    assert c.shared_expert_intermediate_size == 128 and c.expert_intermediate_size == 32
    assert model.stack is not None  # decoder.cpp runs the shared expert inside the layer's one MoE call
    mlp = model.layers[1].mlp
    assert mlp.shared_gate_weight.shape == (64,) and mlp.shared_gate_weight.dtype == torch.float32
    # the shared expert's matrices in the file's Q8_0, as a dense MLP's
    assert all(isinstance(lin, QuantLinear) and lin.bits == 8 for lin in (mlp.shared_gate_up, mlp.shared_down))
    assert (mlp.shared_gate_up.out_features, mlp.shared_down.in_features) == (256, 128)


@ARCHS
def test_float32_logits_match_llama_cpp_and_a_float64_forward(files, arch):
    path = files(arch=arch)
    model = load_model(path)
    tokens = _tokens()
    ours = our_logits(model, tokens)
    assert _max_rel(ours, reference_logits(path, tokens)) < 1e-5  # measured 4e-7 (both)
    theirs = torch.from_numpy(llama_cpp_logits(llama_cpp_model(path, 128), tokens))
    assert _max_rel(ours, theirs) < 1e-4  # measured 4.5e-7 (qwen3moe), 4.8e-7 (qwen2moe)
    assert_agrees(summarize([agreement(ours[:-1], theirs[:-1], torch.tensor(tokens[1:]))]))
    for layer in model.layers:  # the renormalisation is the family's (qwen3moe's: without it, 0.15 off)
        layer.mlp.norm_top_k = not layer.mlp.norm_top_k
    assert _max_rel(our_logits(model, tokens), theirs) > 1e-2
    if arch == "qwen2moe":  # and every token takes the shared expert
        for layer in model.layers:
            layer.mlp.norm_top_k, layer.mlp.shared_gate = False, None
        assert _max_rel(our_logits(model, tokens), theirs) > 1e-2


@needs_kernels
@ARCHS
@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0], ids=lambda q: q.name)
def test_experts_on_embers_kernels_agree_with_llama_cpp_on_the_same_file(files, qtype, arch):
    """Both quantize the activations to int8 per 32 values and multiply exactly; a token whose
    router scores sit near a tie may take another expert in one of them, which the fidelity
    bar's near-tie rule allows."""
    path = files(qtype, arch)
    tokens = _tokens(1)
    ours = our_logits(load_model(path, quantized=True), tokens)
    theirs = torch.from_numpy(llama_cpp_logits(llama_cpp_model(path, 128), tokens))
    assert_agrees(summarize([agreement(ours[:-1], theirs[:-1], torch.tensor(tokens[1:]))]))
    assert _max_rel(ours, reference_logits(path, tokens)) < 0.2


def _llama_cpp_quantize(src, dst, ftype: int = 15) -> None:  # 15: LLAMA_FTYPE_MOSTLY_Q4_K_M
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = ftype, 1
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) == 0


@needs_kernels
@ARCHS
def test_a_q4_k_m_file_from_llama_cpps_quantizer_runs_on_embers_kernels(tmp_path, arch):
    """Real files' layout: llama.cpp's quantizer leaves the router F32 and makes the experts Q4_K
    and Q6_K (down, on some layers). Ember takes every expert on its kernels, `auto` chooses its
    engine, and it is as close to the float64 forward of the file as the fidelity bar asks (top-1
    98.3%, mean KL 0.0011, measured). Against llama.cpp itself the bar's KL and near-tie rules
    hold, but not its top-1: these random weights' next-token distributions are nearly flat, and
    llama.cpp's 256-value activation blocks (Q8_K) move it off the exact forward more than Ember's
    32-value ones (llama.cpp to the float64 forward: top-1 92.4%, KL 0.0022, every departure a
    near-tie; Ember to llama.cpp: 90.8%, KL 0.0027, the largest gap 0.02)."""
    src, path = tmp_path / "f32.gguf", tmp_path / "q4_k_m.gguf"
    write_arch_gguf(src, arch, seed=2, layers=3, norm_jitter=0.2, dims=K_QUANT_READY)
    _llama_cpp_quantize(src, path)
    with GGUFFile(path) as f:
        types = {t.name.split(".", 2)[2]: t.type_name for t in f.tensors.values() if t.name.startswith("blk.")}
    assert types["ffn_gate_inp.weight"] == "F32" and types["ffn_gate_exps.weight"] == "Q4_K"
    machine = MachineInfo(ram_free_bytes=8 * GiB, ram_total_bytes=16 * GiB, cpu_count=2, ember_kernels=True)
    assert choose_backend(machine, model_footprint(path)).backend == "torch"  # auto: see MOE_ON_LLAMA_CPP
    assert choose_backend(machine, model_footprint(path), backend="torch").backend == "torch"
    model = load_model(path, quantized=True)
    shared = lambda mlp: (mlp.shared_gate_up, mlp.shared_down) if mlp.shared_gate is not None else ()
    assert all(isinstance(lin, QuantLinear) for layer in model.layers
               for lin in (*layer.mlp.gate_up, *layer.mlp.down, *shared(layer.mlp)))
    assert model.stack is not None
    tokens = _tokens(4, 120)
    ours, targets = our_logits(model, tokens)[:-1], torch.tensor(tokens[1:])
    exact = reference_logits(path, tokens)[:-1]
    theirs = torch.from_numpy(llama_cpp_logits(llama_cpp_model(path, 128), tokens))[:-1]
    mine, llama = (summarize([agreement(x, exact, targets)]) for x in (ours, theirs))
    # qwen2moe's file is flatter still: Ember and llama.cpp each take the exact forward's top token
    # 94.1% of the time, every departure a gap under 0.001 (Ember's KL 0.0002, llama.cpp's 0.0004):
    # top-1 as often as llama.cpp's, and the rest of the bar
    assert mine["top1"] >= min(TOP1_MIN, llama["top1"]), (mine, llama)
    assert_agrees(mine | {"top1": max(mine["top1"], TOP1_MIN)})
    f = summarize([agreement(ours, theirs, targets)])
    print(format_summary(f"{arch} Q4_K_M, Ember vs llama.cpp", f))
    assert f["kl"] <= MEAN_KL_MAX, f
    assert near_ties_ok(f["disagreements"], f["over_near_tie"], f["max_gap"]), f


@torch.inference_mode()
@pytest.mark.parametrize("qtype", [None, QT.Q4_0], ids=["f32", "Q4_0"])
def test_chunked_prefill_and_paged_decode_match_one_prefill(files, qtype):
    if qtype is not None and kernels() is None:
        pytest.skip("Ember's CPU kernels are not built")
    model = load_model(files(qtype), quantized=qtype is not None)
    tokens = _tokens(2)
    whole = our_logits(model, tokens)
    torch.testing.assert_close(our_logits(model, tokens, chunk=13), whole, rtol=1e-5, atol=1e-5)
    caches = kv_pool(model, T)
    nb = caches[0][0].shape[0]
    ids = torch.tensor(tokens)
    n = 20
    model(ids[:n], torch.arange(n), caches, prefill_meta(0, n, nb))
    for pos in range(n, T):
        hidden = model(ids[pos:pos + 1], torch.tensor([pos]), caches, decode_meta(pos, nb))
        torch.testing.assert_close(model.compute_logits(hidden)[0], whole[pos], rtol=1e-5, atol=1e-5)


def _slots(tables: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    return tables[seq, pos // BLOCK] * BLOCK + pos % BLOCK


@torch.inference_mode()
def _greedy_together(model, prompts: list[list[int]], steps: int, blocks_each: int = 8) -> torch.Tensor:
    """Every prompt prefilled in one step, then `steps` greedy decode steps of all of them in one
    batch; float32 logits [S, steps + 1, V] after each step."""
    S = len(prompts)
    caches = kv_pool(model, S * blocks_each * BLOCK)
    tables = torch.arange(S * blocks_each).view(S, blocks_each)
    seqs = [list(p) for p in prompts]
    pos = torch.cat([torch.arange(len(p)) for p in seqs])
    seq = torch.cat([torch.full((len(p),), i) for i, p in enumerate(seqs)])
    starts = np.cumsum([0] + [len(p) for p in seqs]).tolist()
    meta = AttentionMetadata(_slots(tables, seq, pos), starts, [len(p) for p in seqs], tables, 0)
    hidden = model(torch.tensor([t for p in seqs for t in p]), pos, caches, meta)
    logits = [model.compute_logits(hidden[torch.tensor(starts[1:]) - 1])]
    for _ in range(steps):
        nxt = logits[-1].argmax(-1)
        for s, t in zip(seqs, nxt.tolist()):
            s.append(t)
        pos, lens = torch.tensor([len(s) - 1 for s in seqs]), [len(s) for s in seqs]
        meta = AttentionMetadata(_slots(tables, torch.arange(S), pos), list(range(S + 1)), lens, tables, S,
                                 decode_seq_lens=torch.tensor(lens))
        logits.append(model.compute_logits(model(nxt, pos, caches, meta)))
    return torch.stack(logits, 1)


@ARCHS
@pytest.mark.parametrize("qtype,native", [(None, False), (QT.Q4_0, False), (QT.Q4_0, True)],
                         ids=["f32", "Q4_0-python-layers", "Q4_0-native-stack"])
def test_a_sequence_is_the_same_bits_alone_and_among_others_routed_differently(files, qtype, native, arch):
    """Grouping a step's rows by expert puts each sequence's rows in one matmul with other
    sequences' rows; every linear is row-invariant and each row's k outputs are added in its own
    rank order, so nothing a sequence computes depends on what else the step holds: on the
    Python layers and in the native stack (engine/kernels/csrc/moe.cpp) alike."""
    if qtype is not None and kernels() is None:
        pytest.skip("Ember's CPU kernels are not built")
    model = load_model(files(qtype, arch), quantized=qtype is not None)
    stack = model.stack if native else None
    assert stack is not None or not native
    model.stack = stack
    prompts = [_tokens(10 + i, n) for i, n in enumerate((5, 23, 40, 11, 31))]
    together = _greedy_together(model, prompts, steps=6)
    seen = []  # the routes, from the Python layers (the stack is one op: no hook sees inside it)
    model.stack = None
    hook = model.layers[0].mlp.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    _greedy_together(model, prompts, steps=6)
    hook.remove()
    model.stack = stack
    for i, p in enumerate(prompts):
        alone = _greedy_together(model, [p], steps=6)[0]
        assert torch.equal(together[i], alone), f"sequence {i} differs by {(together[i] - alone).abs().max()}"
    chosen = model.layers[0].mlp.route(seen[-1])[1]  # the last decode step's experts, one row a sequence
    assert len({tuple(sorted(row)) for row in chosen.tolist()}) > 1  # they took different experts


@needs_kernels
@ARCHS
@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0], ids=lambda q: q.name)
@pytest.mark.parametrize("path", available_paths() if kernels() is not None else [], ids=lambda p: p.name)
def test_the_native_stack_runs_the_experts_as_the_python_layers_do(files, qtype, path, monkeypatch, arch):
    """One C++ op for the whole stack, the experts included (router, top-k, the step's rows
    grouped by expert, each expert's tiles once), against the Python layers over the same
    quantized linears and the same routing op, on this CPU path. The layers' other glue (norms,
    attention) sums in other orders, 1e-7 apart, as for the dense families; a wrong weight, a
    wrong expert or a row added twice is O(1)."""
    monkeypatch.setenv("EMBER_CPU_PATH", path.name.lower())
    file = files(qtype, arch)
    model = load_model(file, quantized=True)
    assert model.stack is not None
    tokens = _tokens(2)
    stacked = our_logits(model, tokens, chunk=29)
    model.stack = None
    layered = our_logits(model, tokens, chunk=29)
    assert _max_rel(stacked, layered) < 5e-2
    assert_agrees(summarize([agreement(stacked[:-1], layered[:-1], torch.tensor(tokens[1:]))]))
    assert _max_rel(stacked, reference_logits(file, tokens)) < 0.2


@needs_kernels
def test_the_engine_gives_each_of_twelve_staggered_chats_what_it_gives_it_alone(files):
    """Through the scheduler: arrivals staggered, prefill chunks beside other chats' decodes in one
    step, so each step's experts see another mix of rows; every chat's greedy tokens are the ones
    it gets alone."""
    engine = LLMEngine(EngineConfig(model_path=str(files(QT.Q4_0)), dtype="float32", num_threads=1, block_size=4,
                                    max_prefill_chunk=16, max_num_batched_tokens=64))
    prompts = [_tokens(30 + i, 3 + 5 * i) for i in range(12)]
    max_tokens = [4 + (7 * i) % 17 for i in range(12)]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    alone = [engine.generate([p], q)[0].output_token_ids for p, q in zip(prompts, params)]
    assert run_staggered(engine, prompts, max_tokens, 2) == alone


@needs_kernels
def test_auto_runs_qwen3moe_on_embers_native_stack(files):
    """`auto` runs a mixture of experts on Ember's kernels, its experts in the native stack (one
    stream decodes faster there than on llama.cpp: MOE_ON_LLAMA_CPP), and says so."""
    assert not MOE_ON_LLAMA_CPP
    config = EngineConfig(model_path=str(files(QT.Q8_0)), num_threads=1, max_model_len=128)
    assert decide(config).backend == "torch" and MOE_NATIVE in decide(config).reason
    engine, decision = load_engine(config)
    try:
        assert decision.backend == "torch" and "Ember's kernels" in decision.reason, decision.reason
        assert engine.runner.model.stack is not None
        params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
        outs = engine.generate(["hello there, the one", "hello", "the other one and"], params)
        assert all(len(o.output_token_ids) == 30 and o.finish_reason == "length" for o in outs)
    finally:
        engine.close()


def test_the_fit_counts_the_whole_file_and_the_reason_names_the_runner_and_the_active_bytes(files):
    """The router stays F32 in a quantized file (as llama.cpp's quantizer leaves it) and Ember
    holds it in float32, so it does not keep the file off the kernels; the estimate is the whole
    file (it is all held), and the reason says how much of it one token reads: everything but
    the experts it does not take (2 of 4 here)."""
    machine = MachineInfo(ram_free_bytes=8 * GiB, ram_total_bytes=16 * GiB, cpu_count=2, ember_kernels=True)
    path = files(QT.Q8_0)
    with GGUFFile(path) as f:
        assert f.tensors["blk.0.ffn_gate_inp.weight"].type_name == "F32"
        total = sum(t.nbytes for t in f.tensors.values())
        experts = sum(t.nbytes for t in f.tensors.values() if "_exps." in t.name)
    fp = model_footprint(path)
    assert fp.ember_engine and fp.kernels_cover and fp.active_bytes == total - experts // 2
    d = choose_backend(machine, fp, backend="torch")
    assert d.backend == "torch" and "torch on Ember's kernels" in d.reason, d.reason
    auto = choose_backend(machine, fp)
    assert auto.backend == "torch" and MOE_NATIVE in auto.reason, auto.reason
    assert f"a mixture of experts: {fp.active_bytes / GiB:.2f} GiB of its {fp.weights_bytes / GiB:.2f} GiB" in d.reason
    assert "llama.cpp (as requested)" in choose_backend(machine, fp, backend="llama.cpp").reason
    per_token = kv_bytes_per_token(fp.num_layers, fp.num_kv_heads, fp.head_dim, 4)  # float32 KV on torch
    assert d.est_bytes == fp.weights_bytes + per_token * d.context_length + RUNTIME_OVERHEAD_BYTES
    # float32 experts: llama.cpp runs the file, and the reason says why not Ember's engine
    d = choose_backend(machine, model_footprint(files()))
    assert d.backend == "llama.cpp" and "not on Ember's kernels" in d.reason and "a mixture of experts" in d.reason
