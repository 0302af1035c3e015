"""Greedy chat replies of the torch engine against llama.cpp on the bundled model.

Where Ember's reply first departs from llama.cpp's, the step must be a near-tie: llama.cpp's
probability of its own top token exceeds its probability of Ember's token by little (the rule and
its figures: tests/model_oracles.py; llama.cpp multiplies Q4_1 weights with activations rounded to
8 bits, differently on AVX2 and AVX-512, so a float engine cannot agree on every near-tie).
"""
from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from model_oracles import assert_departures_are_near_ties

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Give me three tips for sleeping better.",
    "Explain photosynthesis in one paragraph.",
    "Translate 'good morning' into Spanish and German.",
]
NEW_TOKENS = 40


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def test_greedy_replies_depart_only_at_near_ties(bundled_model_path):
    import llama_cpp

    engine = LLMEngine(EngineConfig(model_path=str(bundled_model_path), dtype="float32", num_threads=2,
                                    num_kv_blocks=256))
    llm = llama_cpp.Llama(model_path=str(bundled_model_path), n_ctx=512, n_threads=2,
                          logits_all=True, verbose=False)
    prompts = [engine.tokenizer.encode(engine.chat_template.render([{"role": "user", "content": q}]))
               for q in QUESTIONS]
    ours = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS))
    identical, gaps, report = 0, [], []
    for prompt, out in zip(prompts, ours):
        theirs: list[int] = []
        for tok in llm.generate(prompt, temp=0.0, reset=True):
            theirs.append(tok)
            if tok == llm.token_eos() or len(theirs) >= NEW_TOKENS:
                break
        mine = out.output_token_ids
        n = min(len(mine), len(theirs))
        k = next((i for i in range(n) if mine[i] != theirs[i]), None)
        if k is None:
            assert mine[:n] == theirs[:n]
            identical += 1
            continue
        # llama.cpp's distribution at the first departing step, on the shared prefix.
        llm.reset()
        llm.eval(prompt + theirs[:k])
        p = _softmax(np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64))
        gaps.append(float(p[theirs[k]] - p[mine[k]]))
        report.append(f"reply to {engine.tokenizer.decode(prompt)!r} departs at step {k} with llama.cpp gap {gaps[-1]:.3f}")
    print(f"\n{identical}/{len(prompts)} greedy replies identical to llama.cpp over {NEW_TOKENS} tokens\n" + "\n".join(report))
    assert_departures_are_near_ties(gaps, "\n".join(report))
