"""SmolVLM / SmolVLM2 images (an idefics3 projector) on the llama.cpp runner, on
tests/smolvlm_factory.py's tiny random llama LM (with SmolVLM's image tokens) and projector.

An idefics3 image is several mtmd chunks: its tiles, each after "<fake_token_around_image><row_R_col_C>",
then the overview after "<global-img>". The oracle is llama-cpp-python's own mtmd path on a plain
llama context (test_llamacpp_mrope's `MtmdOracle`: `mtmd_helper_eval_chunk_single` chunk by chunk,
then greedy decoding): Ember's runner must give its greedy tokens and log-probabilities, whole and in
prefill chunks that end inside a tile. Random weights: this proves the plumbing, never answer quality."""
from __future__ import annotations

import pytest

from engine.backends import load_engine
from engine.config import EngineConfig
from engine.images import Image
from engine.sampling_params import SamplingParams
from smolvlm_factory import write_tiny_smolvlm
from test_llamacpp_mrope import MtmdOracle, _assert_matches, _finish, _top
from vlm_factory import random_pixels

TOP = 8


def _image(seed: int, height: int = 48, width: int = 40) -> Image:
    px = random_pixels(seed, height, width)
    return Image(px.shape[1], px.shape[0], px.tobytes())


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    return write_tiny_smolvlm(tmp_path_factory.mktemp("smolvlm"))


def _engine(vlm, **kw):
    config = EngineConfig(model_path=str(vlm.model), mmproj=str(vlm.mmproj), num_threads=1, max_model_len=256, **kw)
    engine, decision = load_engine(config, backend="llama.cpp", device="cpu")
    assert decision.backend == "llama.cpp" and engine.runner.vision is not None
    return engine


def _run(engine, text: str, images: list[Image], max_tokens: int = 4):
    ids, spans = engine.runner.vision.tokenize(text, images)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=TOP, ignore_eos=True)
    return _finish(engine, [engine.add_request(ids, params, images=spans)])[0], ids, spans


def _pieces(engine, ids: list[int], spans) -> list[str]:
    """The prompt's tokens as text, each image token as '#'."""
    inside = {i for s in spans for i in range(s.start, s.end)}
    return ["#" if i in inside else engine.tokenizer.decode([t]) for i, t in enumerate(ids)]


def test_an_image_is_mtmds_tiles_wrapped_in_smolvlms_tokens_and_moves_the_logits(vlm):
    engine = _engine(vlm, enable_prefix_caching=False)
    try:
        marker, fake = engine.runner.vision.marker, "<fake_token_around_image>"
        plain, _, _ = _run(engine, "Describe: what is it?", [])
        a, ids, spans = _run(engine, f"Describe: {marker} what is it?", [_image(1)])
        assert [s.num_tokens for s in spans] == [4] * 5 and sum(s.num_tokens for s in spans) == vlm.image_tokens
        assert a.num_prompt_tokens == len(ids)  # every image token is a prompt token (KV accounting)
        pieces = _pieces(engine, ids, spans)
        assert "".join(pieces) == (f"Describe: {fake}<row_1_col_1>####{fake}<row_1_col_2>####\n{fake}<row_2_col_1>####"
                                   f"{fake}<row_2_col_2>####\n\n{fake}<global-img>####{fake} what is it?")
        assert {"\n", "\n\n", fake, "<global-img>", "<row_2_col_2>"} <= set(pieces)  # each one token
        wide, wide_ids, wide_spans = _run(engine, f"Describe: {marker} what is it?", [_image(1, 30, 70)])
        assert len(wide_spans) == 3 and "<row_1_col_2>####\n\n" in "".join(_pieces(engine, wide_ids, wide_spans))
        b, _, _ = _run(engine, f"Describe: {marker} what is it?", [_image(2)])
        assert _top(a) != _top(plain) and _top(a) != _top(b) and _top(a) != _top(wide)
        assert engine.runner.vision.encodes == 5 + 3 + 5  # every tile and overview, once
    finally:
        engine.close()


def test_the_same_image_gives_the_same_bits_twice_and_in_a_fresh_engine(vlm):
    text = "Look {} and say"
    first = _engine(vlm, enable_prefix_caching=False)
    try:
        a, _, _ = _run(first, text.format(first.runner.vision.marker), [_image(3)])
        b, _, _ = _run(first, text.format(first.runner.vision.marker), [_image(3)])
    finally:
        first.close()
    again = _engine(vlm, enable_prefix_caching=False)
    try:
        c, _, _ = _run(again, text.format(again.runner.vision.marker), [_image(3)])
    finally:
        again.close()
    assert _top(a) == _top(b) == _top(c) and a.output_token_ids == b.output_token_ids == c.output_token_ids


@pytest.mark.parametrize("chunk", [None, 8])
def test_the_runner_gives_mtmds_own_helper_path_s_greedy_tokens(vlm, chunk):
    """Whole, and in prefill chunks of 8 that end inside tiles (each tile is then decoded whole)."""
    engine = _engine(vlm, enable_prefix_caching=False, **({"max_prefill_chunk": chunk} if chunk else {}))
    oracle = MtmdOracle(vlm, engine.runner.flash_attn)
    try:
        marker = engine.runner.vision.marker
        for text, images in ((f"Describe: {marker} what is it?", [_image(4)]),
                             (f"One {marker} and the other {marker} which?", [_image(5, 30, 70), _image(6)])):
            out, _, spans = _run(engine, text, images)
            if chunk:
                assert any(s.start // chunk != s.end // chunk for s in spans)
            _assert_matches(out, oracle.greedy(text, images, 4))
    finally:
        oracle.close()
        engine.close()


def test_the_next_turn_about_a_picture_encodes_none_of_its_tiles_again(vlm):
    engine = _engine(vlm)
    oracle = MtmdOracle(vlm, engine.runner.flash_attn)
    try:
        marker = engine.runner.vision.marker
        first, _, spans = _run(engine, f"Look {marker} and say", [_image(7)], max_tokens=3)
        assert engine.runner.vision.encodes == 5
        follow = f"Look {marker} and say" + engine.tokenizer.decode(first.output_token_ids) + " then more words"
        second, _, _ = _run(engine, follow, [_image(7)])
        assert engine.runner.vision.encodes == 5 and second.num_cached_tokens >= spans[-1].end
        _assert_matches(second, oracle.greedy(follow, [_image(7)], 4))
    finally:
        oracle.close()
        engine.close()
