"""Embeddings on Ember's engine: each input a sequence of the chats' scheduler, mean-pooled by the
runner from the final hidden states. The oracle for the values is llama.cpp (test_embeddings_api);
here, on the real engine and the tiny model: the same vector (to float rounding: a chunk reads the
earlier rows from the bf16 KV) whether its prompt runs in one chunk or many, alone or batched with a
streaming chat (which keeps its own tokens), never from the prefix cache; a runner that cannot
pool refuses it.
"""
from __future__ import annotations

import numpy as np
import pytest
from server_util import tiny_model

from engine.backends import load_engine
from engine.config import EngineConfig
from engine.sampling_params import SamplingParams

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello world",
         "A longer text about rivers, hills and quiet seas, " * 6]
EMBED = SamplingParams(max_tokens=1, embed=True)


def _engine(path, **kw):
    return load_engine(EngineConfig(model_path=str(path), num_threads=1, num_kv_blocks=256, **kw), "torch", "cpu")[0]


def _run(engine, prompts: dict) -> dict:
    """request id -> its final output, for prompts {rid: (ids, params)} added together."""
    for rid, (ids, params) in prompts.items():
        engine.add_request(ids, params, request_id=rid)
    done = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                done[o.request_id] = o
    return done


@pytest.fixture(scope="module")
def path(tiny_model_factory):
    return tiny_model(tiny_model_factory)


@pytest.fixture(scope="module")
def alone(path):
    """Each text's vector, computed alone in one chunk."""
    engine = _engine(path)
    try:
        ids = [engine.tokenizer.encode(t, parse_special=False) for t in TEXTS]
        return ids, [np.asarray(_run(engine, {f"e{i}": (x, EMBED)})[f"e{i}"].embedding) for i, x in enumerate(ids)]
    finally:
        engine.close()


def test_chunks_and_a_batch_with_a_chat_give_the_same_vectors(path, alone, one_torch_thread):
    ids, want = alone
    engine = _engine(path, max_prefill_chunk=16)  # the long text takes several steps
    try:
        chat = engine.tokenizer.encode("Once upon a time")
        greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        solo = _run(engine, {"chat": (chat, greedy)})["chat"].output_token_ids
        engine.add_request(chat, greedy, request_id="chat")
        for _ in range(3):  # the chat is decoding when the embeddings join it
            engine.step()
        done = _run(engine, {f"e{i}": (x, EMBED) for i, x in enumerate(ids)})
        assert done["chat"].output_token_ids == solo
        assert len(ids[2]) > 16
        for i, v in enumerate(want):
            out = done[f"e{i}"]
            assert out.finish_reason == "stop" and out.output_token_ids == [] and out.num_cached_tokens == 0
            np.testing.assert_allclose(out.embedding, v, rtol=1e-4, atol=1e-5)
    finally:
        engine.close()


def test_an_embedding_never_comes_from_the_prefix_cache(path, alone, one_torch_thread):
    ids, want = alone
    engine = _engine(path)
    try:
        _run(engine, {"warm": (ids[2], SamplingParams(temperature=0, max_tokens=2))})  # its blocks are cached
        out = _run(engine, {"e": (ids[2], EMBED)})["e"]
        assert out.num_cached_tokens == 0
        np.testing.assert_allclose(out.embedding, want[2], rtol=1e-4, atol=1e-5)
        full = engine.tokenizer.encode("word " * 600, parse_special=False)[:engine.max_model_len]
        assert len(_run(engine, {"f": (full, EMBED)})["f"].embedding) == len(want[0])  # the whole context
    finally:
        engine.close()


def test_a_runner_that_cannot_pool_refuses(path):
    engine = load_engine(EngineConfig(model_path=str(path), num_threads=1), "llama.cpp", "cpu")[0]
    try:
        with pytest.raises(ValueError, match="no embeddings"):
            engine.add_request([1, 2, 3], EMBED)
    finally:
        engine.close()
