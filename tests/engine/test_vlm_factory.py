"""The tiny vision model (tests/vlm_factory.py) against llama.cpp's libmtmd itself: the projector
loads beside its LM, a prompt with mtmd's marker and one bitmap tokenizes into text, image, text
chunks with the image token count the factory promises, the image encodes to finite embeddings of
the LM's width, and evaluating the chunks gives logits that depend on the pixels, bit for bit."""
from __future__ import annotations

import ctypes

import llama_cpp as ll
import numpy as np
import pytest
from llama_cpp import _logger  # noqa: F401  installs llama.cpp's quiet log callback
from llama_cpp import mtmd_cpp as mtmd

from vlm_factory import LM_WIDTH, random_pixels, write_tiny_vlm


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    mtmd.mtmd_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
    mtmd.mtmd_helper_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
    files = write_tiny_vlm(tmp_path_factory.mktemp("vlm"))
    ll.llama_backend_init()
    model = ll.llama_model_load_from_file(str(files.model).encode(), ll.llama_model_default_params())
    params = mtmd.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings, params.warmup = False, 1, False, False
    ctx = mtmd.mtmd_init_from_file(str(files.mmproj).encode(), model, params)
    assert ctx, "libmtmd refused the tiny projector"
    cparams = ll.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch, cparams.n_threads = 256, 64, 64, 1
    lctx = ll.llama_init_from_model(model, cparams)
    yield files, model, ctx, lctx
    ll.llama_free(lctx)
    mtmd.mtmd_free(ctx)
    ll.llama_model_free(model)


def _chunks(ctx, text: str, images: list[np.ndarray]):
    bitmaps = []
    for px in images:
        buf = (ctypes.c_uint8 * px.size).from_buffer_copy(np.ascontiguousarray(px).tobytes())
        bitmaps.append(mtmd.mtmd_bitmap_init(px.shape[1], px.shape[0], buf))
    inp = mtmd.mtmd_input_text()
    raw = text.encode()
    inp.text, inp.text_len, inp.add_special, inp.parse_special = raw, len(raw), True, True
    chunks = mtmd.mtmd_input_chunks_init()
    arr = (mtmd.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
    assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), arr, len(bitmaps)) == 0
    for b in bitmaps:
        mtmd.mtmd_bitmap_free(b)
    return chunks


def test_projector_loads_with_vision(vlm):
    _, _, ctx, _ = vlm
    assert mtmd.mtmd_support_vision(ctx) and not mtmd.mtmd_support_audio(ctx)
    assert not mtmd.mtmd_decode_use_mrope(ctx)


def test_tokenize_and_encode_one_image(vlm):
    files, _, ctx, _ = vlm
    marker = mtmd.mtmd_default_marker().decode()
    chunks = _chunks(ctx, f"Look: {marker} what?", [random_pixels(1)])
    try:
        kinds = [mtmd.mtmd_input_chunk_get_type(mtmd.mtmd_input_chunks_get(chunks, i))
                 for i in range(mtmd.mtmd_input_chunks_size(chunks))]
        assert kinds.count(mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE) == 1
        image = mtmd.mtmd_input_chunks_get(chunks, kinds.index(mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE))
        assert mtmd.mtmd_input_chunk_get_n_tokens(image) == files.image_tokens == 16
        assert mtmd.mtmd_input_chunk_get_n_pos(image) == files.image_tokens
        assert mtmd.mtmd_encode_chunk(ctx, image) == 0
        embd = np.ctypeslib.as_array(mtmd.mtmd_get_output_embd(ctx), (files.image_tokens * LM_WIDTH,))
        assert np.isfinite(embd).all() and np.abs(embd).max() > 0
    finally:
        mtmd.mtmd_input_chunks_free(chunks)


def _logits(vlm, images: list[np.ndarray]) -> tuple[int, np.ndarray]:
    _, model, ctx, lctx = vlm
    ll.llama_memory_clear(ll.llama_get_memory(lctx), True)
    marker = mtmd.mtmd_default_marker().decode()
    chunks = _chunks(ctx, "Look: " + marker * len(images) + " what?", images)
    try:
        n_past = ll.llama_pos(0)
        assert mtmd.mtmd_helper_eval_chunks(ctx, lctx, chunks, 0, 0, 64, True, ctypes.byref(n_past)) == 0
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
    return n_past.value, np.ctypeslib.as_array(ll.llama_get_logits_ith(lctx, -1), (n_vocab,)).copy()


def test_logits_depend_on_the_pixels_exactly(vlm):
    files = vlm[0]
    n_text, _ = _logits(vlm, [])
    n_a, a = _logits(vlm, [random_pixels(1)])
    _, a_again = _logits(vlm, [random_pixels(1)])
    _, b = _logits(vlm, [random_pixels(2)])
    assert n_a > n_text + files.image_tokens - 1  # the image's positions plus its wrapper text
    assert np.array_equal(a, a_again)
    assert not np.array_equal(a, b) and np.abs(a - b).max() > 1e-4
    assert np.isfinite(a).all()
