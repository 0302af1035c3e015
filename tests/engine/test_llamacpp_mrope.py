"""Qwen2-VL / Qwen2.5-VL images on the llama.cpp runner (M-RoPE: an image takes fewer positions
than tokens), on tests/vlm_factory.py's tiny random qwen2vl LM and its qwen2.5vl_merger (and
qwen2vl_merger) projector.

The oracle is llama-cpp-python's own mtmd path on a plain llama context: `mtmd_helper_eval_chunks`
places the prompt's text and image (moving n_past by the image's n_pos), then greedy decoding at
the positions it reported. Ember's runner must give the same greedy tokens and log-probabilities,
and the oracle with every token at its index (what the runner did before) must not: the shift is
what the test sees. Random weights: this proves the plumbing, never answer quality."""
from __future__ import annotations

import ctypes

import pytest
import torch
from gguf import GGMLQuantizationType

from engine.backends import load_engine
from engine.config import EngineConfig
from engine.images import Image
from engine.sampling_params import SamplingParams
from vlm_factory import random_pixels, write_tiny_qwen2vl

TOP = 8


def _image(seed: int, height: int = 48, width: int = 40) -> Image:
    px = random_pixels(seed, height, width)
    return Image(px.shape[1], px.shape[0], px.tobytes())


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    return write_tiny_qwen2vl(tmp_path_factory.mktemp("qwen25vl"))


def _engine(vlm, **kw):
    kw = {"max_model_len": 256, **kw}
    config = EngineConfig(model_path=str(vlm.model), mmproj=str(vlm.mmproj), num_threads=1, **kw)
    engine, decision = load_engine(config, backend="llama.cpp", device="cpu")
    assert decision.backend == "llama.cpp" and engine.runner.vision is not None
    return engine


def _finish(engine, rids: list[str]) -> list:
    final, lps = {}, {rid: [] for rid in rids}
    while engine.has_unfinished():
        for o in engine.step():
            lps[o.request_id] += o.logprobs or []
            if o.finished:
                final[o.request_id] = o
    for rid in rids:
        final[rid].logprobs = lps[rid]
    return [final[rid] for rid in rids]


def _run(engine, text: str, images: list[Image], max_tokens: int = 4):
    ids, spans = engine.runner.vision.tokenize(text, images)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=TOP, ignore_eos=True)
    return _finish(engine, [engine.add_request(ids, params, images=spans)])[0], ids, spans


def _top(out) -> list[list[tuple[int, float]]]:
    return [lp.top for lp in out.logprobs]


class MtmdOracle:
    """The same files through llama-cpp-python's mtmd helpers on a one-sequence llama context."""

    def __init__(self, vlm, flash_attn: bool) -> None:
        import llama_cpp as ll
        from llama_cpp import mtmd_cpp as m

        self.ll, self.m = ll, m
        self.model = ll.llama_model_load_from_file(str(vlm.model).encode(), ll.llama_model_default_params())
        cp = ll.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max, cp.n_threads, cp.n_threads_batch = 256, 256, 256, 1, 1, 1
        cp.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.ctx = ll.llama_init_from_model(self.model, cp)
        p = m.mtmd_context_params_default()
        p.use_gpu, p.n_threads, p.print_timings, p.warmup = False, 1, False, False
        self.mctx = m.mtmd_init_from_file(str(vlm.mmproj).encode(), self.model, p)
        self.vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self.model))
        self.batch = ll.llama_batch_init(1, 0, 1)

    def greedy(self, text: str, images: list[Image], n: int, shift: bool = True) -> list[torch.Tensor]:
        """Log-probabilities of n greedy steps; shift=False puts every token at its index instead."""
        ll, m = self.ll, self.m
        ll.llama_memory_clear(ll.llama_get_memory(self.ctx), True)
        bitmaps = [m.mtmd_bitmap_init(im.width, im.height, (ctypes.c_uint8 * len(im.rgb)).from_buffer_copy(im.rgb))
                   for im in images]
        inp, raw = m.mtmd_input_text(), text.encode()
        inp.text, inp.text_len, inp.add_special, inp.parse_special = raw, len(raw), False, True
        chunks = m.mtmd_input_chunks_init()
        assert m.mtmd_tokenize(self.mctx, chunks, ctypes.byref(inp),
                               (m.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps), len(bitmaps)) == 0
        pos, new = 0, ll.llama_pos(0)
        size = m.mtmd_input_chunks_size(chunks)
        for i in range(size):
            chunk = m.mtmd_input_chunks_get(chunks, i)
            assert m.mtmd_helper_eval_chunk_single(self.mctx, self.ctx, chunk, pos, 0, 256, i == size - 1,
                                                   ctypes.byref(new)) == 0
            pos = new.value if shift else pos + int(m.mtmd_input_chunk_get_n_tokens(chunk))
        out = []
        for _ in range(n):
            ptr = ll.llama_get_logits_ith(self.ctx, -1)
            logp = torch.log_softmax(torch.tensor([ptr[j] for j in range(self.vocab)]), -1)
            out.append(logp)
            self._decode(int(logp.argmax()), pos)
            pos += 1
        m.mtmd_input_chunks_free(chunks)
        return out

    def _decode(self, token: int, pos: int) -> None:
        b = self.batch
        b.token[0], b.pos[0], b.n_seq_id[0], b.logits[0], b.n_tokens = token, pos, 1, 1, 1
        b.seq_id[0][0] = 0
        assert self.ll.llama_decode(self.ctx, b) == 0

    def close(self) -> None:
        self.ll.llama_batch_free(self.batch)
        self.m.mtmd_free(self.mctx)
        self.ll.llama_free(self.ctx)
        self.ll.llama_model_free(self.model)


def _assert_matches(out, oracle_steps: list[torch.Tensor]) -> None:
    """Ember's greedy tokens are the oracle's argmaxes; its top log-probabilities the oracle's."""
    assert out.output_token_ids == [int(lp.argmax()) for lp in oracle_steps]
    for got, want in zip(_top(out), oracle_steps):
        ids = [t for t, _ in got]
        assert torch.allclose(torch.tensor([v for _, v in got]), want[ids], atol=2e-4)


@pytest.mark.parametrize("projector", ["qwen2.5vl_merger", "qwen2vl_merger"])
def test_an_image_takes_mtmds_positions_and_the_text_after_it_follows_them(tmp_path, projector):
    vlm = write_tiny_qwen2vl(tmp_path, projector_type=projector)
    engine = _engine(vlm, enable_prefix_caching=False)
    oracle = MtmdOracle(vlm, engine.runner.flash_attn)
    try:
        text = f"Describe: {engine.runner.vision.marker} what is it?"
        for im in (_image(1), _image(2, 32, 64)):  # 3 x 3 patches at 3 positions; 4 x 2 at 4
            out, ids, spans = _run(engine, text, [im])
            assert len(spans) == 1 and spans[0].num_pos == max(im.width, im.height) // 16
            assert spans[0].num_tokens == (im.width // 16 + (im.width % 16 > 0)) * (im.height // 16 + (im.height % 16 > 0))
            assert out.num_prompt_tokens == len(ids)  # every image token is a prompt token (KV accounting)
            _assert_matches(out, oracle.greedy(text, [im], 4))
            at_index = oracle.greedy(text, [im], 1, shift=False)[0]
            assert not torch.allclose(at_index, oracle.greedy(text, [im], 1)[0], atol=1e-3)
        plain, _, _ = _run(engine, "Describe: what is it?", [])
        assert _top(plain) != _top(out)
    finally:
        oracle.close()
        engine.close()


def test_two_images_shift_the_text_after_each_by_what_each_saves(vlm):
    """Text between two images and after both, prefilled in chunks that end inside each: positions
    as mtmd's helper gives them (the second image starts where the first left the text)."""
    engine = _engine(vlm, enable_prefix_caching=False, max_prefill_chunk=8)
    oracle = MtmdOracle(vlm, engine.runner.flash_attn)
    try:
        marker = engine.runner.vision.marker
        text, images = f"One {marker} and the other {marker} which?", [_image(10), _image(11, 64, 32)]
        out, _, spans = _run(engine, text, images)
        assert [s.num_tokens - s.num_pos for s in spans] == [6, 4]
        _assert_matches(out, oracle.greedy(text, images, 4))
    finally:
        oracle.close()
        engine.close()


def test_the_same_image_gives_the_same_bits_twice_and_after_a_restart(vlm):
    text = "Look {} and say"
    first = _engine(vlm, enable_prefix_caching=False)
    try:
        a, _, _ = _run(first, text.format(first.runner.vision.marker), [_image(3)])
        b, _, _ = _run(first, text.format(first.runner.vision.marker), [_image(3)])
        other, _, _ = _run(first, text.format(first.runner.vision.marker), [_image(4)])
    finally:
        first.close()
    again = _engine(vlm, enable_prefix_caching=False)
    try:
        c, _, _ = _run(again, text.format(again.runner.vision.marker), [_image(3)])
    finally:
        again.close()
    assert _top(a) == _top(b) == _top(c) and a.output_token_ids == c.output_token_ids
    assert _top(a) != _top(other)


def test_the_next_turn_reuses_the_image_s_cells_at_the_shifted_positions(vlm):
    """The second turn takes the slot over (its cells buried past the shared prefix by position)
    and decodes its new text after the image, as the oracle does for the whole second prompt."""
    engine = _engine(vlm)
    oracle = MtmdOracle(vlm, engine.runner.flash_attn)
    try:
        marker = engine.runner.vision.marker
        first, _, spans = _run(engine, f"Look {marker} and say", [_image(5, 40, 64)], max_tokens=3)
        follow = f"Look {marker} and say" + engine.tokenizer.decode(first.output_token_ids) + " then more words"
        second, _, _ = _run(engine, follow, [_image(5, 40, 64)])
        assert engine.runner.vision.encodes == 1 and second.num_cached_tokens >= spans[0].end
        _assert_matches(second, oracle.greedy(follow, [_image(5, 40, 64)], 4))
    finally:
        oracle.close()
        engine.close()


def test_chunks_that_end_inside_an_image_give_the_same_bits(vlm):
    whole = _engine(vlm, enable_prefix_caching=False)
    chunked = _engine(vlm, enable_prefix_caching=False, max_prefill_chunk=8)
    try:
        text = f"Some words first: {whole.runner.vision.marker} what is it?"
        want, _, spans = _run(whole, text, [_image(6)])
        got, _, _ = _run(chunked, text, [_image(6)])
        assert spans[0].start // 8 != spans[0].end // 8  # a chunk boundary falls inside the image
        assert _top(got) == _top(want) and got.output_token_ids == want.output_token_ids
    finally:
        whole.close()
        chunked.close()


def test_image_chats_batch_with_a_text_chat_and_change_no_one_s_answer(tmp_path):
    """Two image chats and a text chat at once: each gets the logprobs it gets alone, bit for bit
    (a Q8_0 LM and exact greedy, as for text: issue 19); the decodes after an image share steps."""
    engine = _engine(write_tiny_qwen2vl(tmp_path, qtype=GGMLQuantizationType.Q8_0), enable_prefix_caching=False)
    try:
        marker = engine.runner.vision.marker
        prompts = [(f"Look: {marker} and tell", [_image(7)]), ("Just some words to go on", []),
                   (f"Here {marker} is it?", [_image(8, 32, 64)])]
        alone = [_run(engine, text, imgs)[0] for text, imgs in prompts]
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


def test_a_resize_carries_an_image_slot_by_its_cells_not_its_positions(vlm):
    """An idle image chat's slot moves into a larger context (a long text prompt needs it): the head
    counts its cells (more than its positions), and its next turn still reads the image from them."""
    engine = _engine(vlm, max_model_len=1024)
    oracle = MtmdOracle(vlm, engine.runner.flash_attn)
    try:
        runner, marker = engine.runner, engine.runner.vision.marker
        first, _, spans = _run(engine, f"Look {marker} and say", [_image(9)], max_tokens=2)
        long = [int(t) for t in torch.randint(0, runner.vocab_size - 8, (600,), generator=torch.Generator().manual_seed(0))]
        params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        _finish(engine, [engine.add_request(long, params)])
        assert runner._context.num_resizes >= 1 and spans[0].num_pos < spans[0].num_tokens
        assert runner._context.head == sum(runner._held_slots().values())
        follow = f"Look {marker} and say" + engine.tokenizer.decode(first.output_token_ids) + " more"
        second, _, _ = _run(engine, follow, [_image(9)])
        assert runner.vision.encodes == 1
        _assert_matches(second, oracle.greedy(follow, [_image(9)], 4))
    finally:
        oracle.close()
        engine.close()
