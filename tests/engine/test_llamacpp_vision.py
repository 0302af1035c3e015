"""Images through the llama.cpp runner's scheduler steps (engine/backends/llamacpp_vision.py), on
tests/vlm_factory.py's tiny random vision model: the image's tokens are mtmd's count and are
counted as prompt tokens (KV accounting); the image changes the next token's log-probabilities,
two images give different ones, the same image gives the same bits twice, also when its prefill
is cut into chunks that end inside the image; the next turn of a chat about a picture reuses
the slot's cells (no second encode). Random weights: this proves the plumbing, never quality."""
from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType

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
    """The final output, its logprobs (top TOP) those of every reply token; the prompt's ids and spans."""
    ids, spans = engine.runner.vision.tokenize(text, images)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=TOP, ignore_eos=True)
    rids = [engine.add_request(ids, params, images=spans)]
    return _finish(engine, rids)[0], ids, spans


def _finish(engine, rids: list[str]) -> list:
    """Step until done; each request's final output with the logprobs of all its steps."""
    final, lps = {}, {rid: [] for rid in rids}
    while engine.has_unfinished():
        for o in engine.step():
            lps[o.request_id] += o.logprobs or []
            if o.finished:
                final[o.request_id] = o
    for rid in rids:
        final[rid].logprobs = lps[rid]
    return [final[rid] for rid in rids]


def _top(out) -> list[list[tuple[int, float]]]:
    return [lp.top for lp in out.logprobs]


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
        assert _top(got) == _top(want) and len(_top(got)) == 3
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


def test_image_chats_batch_with_text_chats_and_change_no_one_s_answer(tmp_path):
    """Continuous batching: two image chats and a text chat at once give each the logprobs it gets
    alone, bit for bit (the image prefills run apart, their decodes in the shared steps; a Q8_0 LM,
    whose row sums do not depend on the batch, and exact greedy, as for text: issue 19)."""
    engine = _engine(write_tiny_vlm(tmp_path, qtype=GGMLQuantizationType.Q8_0), enable_prefix_caching=False)
    try:
        marker = engine.runner.vision.marker
        prompts = [(f"Look: {marker} and tell", [_image(5)]), ("Just some words to go on", []),
                   (f"Here {marker} is it?", [_image(6)])]
        alone = [_run(engine, text, imgs, max_tokens=4)[0] for text, imgs in prompts]
        params = SamplingParams(temperature=0, max_tokens=4, logprobs=TOP, ignore_eos=True)
        rids = []
        for text, imgs in prompts:
            ids, spans = engine.runner.vision.tokenize(text, imgs)
            rids.append(engine.add_request(ids, params, images=spans))
        for got, want in zip(_finish(engine, rids), alone):
            assert got.output_token_ids == want.output_token_ids
            assert _top(got) == _top(want) and len(_top(got)) == 4
    finally:
        engine.close()



def test_smolvlms_projector_loads_and_names_the_tokens_a_model_lacks(tmp_path):
    """An idefics3-type projector (SmolVLM, SmolVLM2) loads in mtmd beside the LM; it wraps an image
    in tokens it looks up by name (<fake_token_around_image>, <global-img>), which this tiny LM's
    vocabulary lacks (SmolVLM's has them): the tokenization says so in words, not as a bad id."""
    from vlm_factory import write_mmproj

    vlm = write_tiny_vlm(tmp_path)
    proj = write_mmproj(tmp_path / "smolvlm-mmproj.gguf", projector_type="idefics3")
    engine = _engine(vlm.__class__(vlm.model, proj, vlm.image_size, vlm.image_tokens))
    try:
        with pytest.raises(ValueError, match="vocabulary lacks the tokens its projector wraps an image in"):
            engine.runner.vision.tokenize(f"Describe: {engine.runner.vision.marker}", [_image(1)])
    finally:
        engine.close()
