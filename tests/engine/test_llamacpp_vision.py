"""Images through the llama.cpp runner's scheduler steps (engine/backends/llamacpp_vision.py), on
tests/vlm_factory.py's tiny random vision model: the image's tokens are mtmd's count and are
counted as prompt tokens (KV accounting); the image changes the next token's log-probabilities,
two images give different ones, the same image gives the same bits twice, also when its prefill
is cut into chunks that end inside the image; the next turn of a chat about a picture reuses
the slot's cells (no second encode). Random weights: this proves the plumbing, never quality."""
from __future__ import annotations

import pytest

from engine.backends import load_engine
from engine.config import EngineConfig
from engine.images import Image
from engine.sampling_params import SamplingParams
from vlm_factory import random_pixels, write_tiny_vlm

TOP = 20


def _image(seed: int) -> Image:
    px = random_pixels(seed)
    return Image(px.shape[1], px.shape[0], px.tobytes())


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    return write_tiny_vlm(tmp_path_factory.mktemp("vlm"))


def _engine(vlm, **kw):
    config = EngineConfig(model_path=str(vlm.model), mmproj=str(vlm.mmproj), num_threads=1, max_model_len=256, **kw)
    engine, decision = load_engine(config, backend="llama.cpp", device="cpu")
    assert decision.backend == "llama.cpp" and engine.runner.vision is not None
    return engine


def _run(engine, text: str, images: list[Image], max_tokens: int = 1):
    """The first reply token's logprobs (top TOP) and the final output."""
    ids, spans = engine.runner.vision.tokenize(text, images)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=TOP, ignore_eos=True)
    rid = engine.add_request(ids, params, images=spans)
    final = None
    while engine.has_unfinished():
        for o in engine.step():
            if o.request_id == rid and o.finished:
                final = o
    return final, ids, spans


def _top(out) -> list[tuple[int, float]]:
    return out.logprobs[0].top


def test_an_image_is_its_tokens_and_moves_the_logits_exactly(vlm):
    engine = _engine(vlm, enable_prefix_caching=False)
    try:
        marker = engine.runner.vision.marker
        plain, plain_ids, _ = _run(engine, "Describe: what is it?", [])
        a, ids, spans = _run(engine, f"Describe: {marker} what is it?", [_image(1)])
        assert len(spans) == 1 and spans[0].num_tokens == vlm.image_tokens
        assert a.num_prompt_tokens == len(ids) >= len(plain_ids) + vlm.image_tokens  # counted as prompt tokens
        a_again, _, _ = _run(engine, f"Describe: {marker} what is it?", [_image(1)])
        b, _, _ = _run(engine, f"Describe: {marker} what is it?", [_image(2)])
        assert _top(a) == _top(a_again)  # the same bits
        assert _top(a) != _top(b)  # another image, other logits
        assert _top(a) != _top(plain)
        assert engine.runner.vision.encodes == 3
    finally:
        engine.close()


def test_chunks_that_end_inside_an_image_give_the_same_bits(vlm):
    whole = _engine(vlm, enable_prefix_caching=False)
    chunked = _engine(vlm, enable_prefix_caching=False, max_prefill_chunk=8)
    try:
        text = f"Describe: {whole.runner.vision.marker} what is it?"
        want, _, spans = _run(whole, text, [_image(3)], max_tokens=3)
        got, _, _ = _run(chunked, text, [_image(3)], max_tokens=3)
        assert spans[0].start % 8 != 0  # a chunk boundary falls inside the image
        assert [lp.top for lp in got.logprobs] == [lp.top for lp in want.logprobs]
        assert got.output_token_ids == want.output_token_ids
    finally:
        whole.close()
        chunked.close()


def test_the_next_turn_about_a_picture_does_not_encode_it_again(vlm):
    engine = _engine(vlm)
    try:
        marker = engine.runner.vision.marker
        first, _, spans = _run(engine, f"Look {marker} and say", [_image(4)], max_tokens=4)
        assert engine.runner.vision.encodes == 1
        follow = engine.tokenizer.decode(first.output_token_ids) + " then more words please"
        second, _, _ = _run(engine, f"Look {marker} and say" + follow, [_image(4)])
        assert engine.runner.vision.encodes == 1  # the slot's cells held the image
        assert second.num_cached_tokens >= spans[0].end
    finally:
        engine.close()
