"""Images in a sequence's context on the llama.cpp runner, through llama.cpp's libmtmd.

A vision model is its LM plus a projector file (--mmproj). `Vision.tokenize` turns a prompt whose
text holds mtmd's marker once per image into token ids and `ImageSpan`s: mtmd's own tokenization
(the model's wrapper text around each image, e.g. Gemma 3's "<start_of_image>") and, for each
image, a run of placeholder ids as long as the embeddings mtmd will give it. The placeholders are
drawn from a hash of the pixels, so the scheduler, the KV accounting (an image's tokens are
prompt tokens) and the prompt cache (a slot's prefix matches only the same pixels) work
unchanged, as vLLM hashes images into its prefix cache.

`Vision.prefill` computes a step's tokens of a sequence that holds images, alone (not in the
step's shared batch): text runs are llama_decode'd as tokens; an image is encoded by the
projector and its embeddings decoded at its positions in one batch (mtmd's helper, which also
switches attention to non-causal for models that want it). An image is never split: a chunk
that ends inside one stops at its start, and the next chunk decodes it whole, so the cells
llama.cpp holds may trail the scheduler's count, never lead it.

M-RoPE models (Qwen2-VL, Qwen2.5-VL) give an image fewer positions than tokens: mtmd places its
nx x ny embeddings at one (temporal) position with 2D offsets, max(nx, ny) positions in all, and
the text after it goes on from there. So a token's llama.cpp position is its index less what the
images before it save (`position`), computed from the sequence's spans, which the token prefix
fixes (a slot's cells match a prompt's only with the same images): every batch the runner builds,
each cell it buries (`llama_memory_seq_rm` takes positions) and each prefix it shares use it. A
text token needs one position value: llama.cpp spreads it over M-RoPE's sections itself.
"""
from __future__ import annotations

import ctypes
import hashlib
import weakref
from dataclasses import dataclass

import torch

from engine.backends.llamacpp_setup import LlamaCppError
from engine.images import MEDIA_MARKER, Image
from engine.model_files.projector import mrope_refusal_of


@dataclass(frozen=True, eq=False)
class ImageSpan:
    """One image of a prompt: its first index, its token count, mtmd's chunk for it and the
    positions it takes (fewer than its tokens with M-RoPE)."""
    start: int
    num_tokens: int
    digest: str
    chunk: int  # an mtmd_input_chunk pointer this span owns (freed with it)
    num_pos: int | None = None  # None: one position per token

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


def placeholder_ids(digest: str, n: int, vocab_size: int) -> list[int]:
    """n token ids drawn from the pixel hash: equal images, equal ids; others differ (almost surely)."""
    raw = b"".join(hashlib.sha256(f"{digest}:{i}".encode()).digest()[:8] for i in range(n))
    return [int.from_bytes(raw[8 * i:8 * i + 8], "little") % vocab_size for i in range(n)]


def position(spans, i: int) -> int:
    """llama.cpp's position of index i of a sequence (never inside an image): i less the positions
    the images wholly before it save (M-RoPE; none for other models)."""
    return i - sum(s.num_tokens - s.num_pos for s in spans if s.end <= i and s.num_pos is not None)


def images_ahead(seq) -> bool:
    """Whether seq's next positions reach an image not yet in its cells (its step runs alone)."""
    return bool(seq.images) and seq.num_computed_tokens < seq.images[-1].end


def cut_before_image(spans, n: int) -> int:
    """n, or the start of the image it would end inside (a cached prefix never splits one)."""
    for s in spans:
        if s.start < n < s.end:
            return s.start
    return n


class Vision:
    """libmtmd's context for one model: the projector loaded beside the runner's llama_model."""

    def __init__(self, ll, model, mmproj: str, threads: int, use_gpu: bool, vocab_size: int) -> None:
        from llama_cpp import _logger, mtmd_cpp

        self._ll, self._mtmd, self.vocab_size = ll, mtmd_cpp, vocab_size
        mtmd_cpp.mtmd_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))  # quiet unless verbose
        mtmd_cpp.mtmd_helper_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu, params.n_threads, params.print_timings, params.warmup = use_gpu, threads, False, False
        self._marker = params.media_marker = MEDIA_MARKER.encode()  # kept alive while mtmd reads it
        self._ctx = mtmd_cpp.mtmd_init_from_file(mmproj.encode(), model, params)
        if not self._ctx:
            raise LlamaCppError(f"llama.cpp's mtmd could not load the projector {mmproj} for this model "
                                "(a projector of another model, or a type this llama.cpp lacks?)")
        if mtmd_cpp.mtmd_decode_use_mrope(self._ctx) and (why := mrope_refusal_of(mmproj)):
            self.close()  # the file check knows the types of today; this, all
            raise LlamaCppError(why)
        if not mtmd_cpp.mtmd_support_vision(self._ctx):
            self.close()
            raise LlamaCppError(f"{mmproj} is a projector without a vision encoder (audio only?)")
        self.marker = MEDIA_MARKER  # where the rendered prompt holds each image (ChatMessage.text)
        self.encodes = 0  # images encoded so far (the prefix cache spares a chat's later turns)

    @classmethod
    def open(cls, ll, model, config, threads: int, use_gpu: bool, vocab_size: int) -> Vision | None:
        """The projector of `config.mmproj` beside `model`; None without one (the model cannot see)."""
        return cls(ll, model, config.mmproj, threads, use_gpu, vocab_size) if config.mmproj else None

    def tokenize(self, text: str, images: list[Image]) -> tuple[list[int], list[ImageSpan]]:
        """Token ids and image spans for `text`, which holds `self.marker` once per image."""
        m = self._mtmd
        if text.count(self.marker) != len(images):
            raise ValueError(f"the prompt has {text.count(self.marker)} image markers for {len(images)} images")
        bitmaps = [m.mtmd_bitmap_init(im.width, im.height, (ctypes.c_uint8 * len(im.rgb)).from_buffer_copy(im.rgb))
                   for im in images]
        for b, im in zip(bitmaps, images):  # each chunk of an image (a slice, for tiling models) names it
            m.mtmd_bitmap_set_id(b, im.digest.encode())
        inp = m.mtmd_input_text()
        raw = text.encode()
        inp.text, inp.text_len, inp.add_special, inp.parse_special = raw, len(raw), False, True
        chunks = m.mtmd_input_chunks_init()
        try:
            arr = (m.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
            if (ret := m.mtmd_tokenize(self._ctx, chunks, ctypes.byref(inp), arr, len(bitmaps))) != 0:
                raise ValueError(f"llama.cpp's mtmd could not tokenize the images (error {ret})")
            return self._read(chunks)
        finally:
            m.mtmd_input_chunks_free(chunks)
            for b in bitmaps:
                m.mtmd_bitmap_free(b)

    def _read(self, chunks) -> tuple[list[int], list[ImageSpan]]:
        m, ids, spans = self._mtmd, [], []
        seen: dict[str, int] = {}  # chunks of each image so far: slices of one image differ
        for i in range(m.mtmd_input_chunks_size(chunks)):
            chunk = m.mtmd_input_chunks_get(chunks, i)
            if m.mtmd_input_chunk_get_type(chunk) == m.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t()
                toks = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                ids.extend(toks[j] for j in range(n.value))
                if any(toks[j] < 0 for j in range(n.value)):  # mtmd looked up a marker the vocabulary lacks
                    raise ValueError("this model's vocabulary lacks the tokens its projector wraps an image in "
                                     "(a projector of another model?)")
                continue
            n_tok, n_pos = int(m.mtmd_input_chunk_get_n_tokens(chunk)), int(m.mtmd_input_chunk_get_n_pos(chunk))
            digest = (m.mtmd_input_chunk_get_id(chunk) or b"").decode()
            seen[digest] = seen.get(digest, -1) + 1
            digest = f"{digest}/{seen[digest]}" if seen[digest] else digest
            own = m.mtmd_input_chunk_copy(chunk)
            span = ImageSpan(len(ids), n_tok, digest, own, n_pos if n_pos != n_tok else None)
            weakref.finalize(span, m.mtmd_input_chunk_free, own)
            spans.append(span)
            ids.extend(placeholder_ids(digest, n_tok, self.vocab_size))
        return ids, spans

    def prefill(self, runner, seq, k: int, m: int) -> torch.Tensor:
        """Compute positions up to num_computed + k of `seq` (holding images) in its llama.cpp
        slot; the logits of the last m of them."""
        slot = runner._slot(seq)
        if runner._kv_len[slot] > seq.num_computed_tokens:  # rejected drafts, a recompute
            runner._rollback(slot, seq.num_computed_tokens)
        pos, end = runner._kv_len[slot], seq.num_computed_tokens + k  # pos < computed: a deferred image
        out = []
        while pos < end:
            span = next((s for s in seq.images if s.end > pos), None)
            if span is not None and span.start <= pos:
                if span.end > end:
                    break  # this chunk ends inside the image: the next one decodes it whole
                if end - m < span.end:
                    raise LlamaCppError("logits inside an image were asked for (prompt logprobs with images)")
                pos = self._decode_image(runner, slot, span, position(seq.images, span.start))
                continue
            stop = min(end, span.start) if span is not None else end
            want = list(range(max(end - m, pos) - pos, stop - pos))
            runner._batch.put(0, slot, seq.token_ids[pos:stop], position(seq.images, pos))
            runner._batch.finish(stop - pos, want)
            out.append(runner._decode(stop - pos, want, stop - pos, False))
            pos = stop
        runner._kv_len[slot] = pos
        return torch.cat(out) if out else torch.empty(0, runner.vocab_size)

    def _decode_image(self, runner, slot: int, span: ImageSpan, n_past: int) -> int:
        m = self._mtmd
        runner._make_room(span.num_tokens)
        if (ret := m.mtmd_encode_chunk(self._ctx, span.chunk)) != 0:
            raise LlamaCppError(f"the projector could not encode an image (error {ret})")
        self.encodes += 1
        new_pos = self._ll.llama_pos(0)
        ret = m.mtmd_helper_decode_image_chunk(self._ctx, runner._ctx, span.chunk, m.mtmd_get_output_embd(self._ctx),
                                               n_past, slot, runner.n_batch, ctypes.byref(new_pos),
                                               m.mtmd_helper_post_decode_callback(), None)  # a NULL callback
        if ret != 0:
            raise LlamaCppError(f"llama.cpp could not decode an image's embeddings (error {ret})")
        runner._context.placed(span.num_tokens, False)
        runner._kv_len[slot] = span.end
        return span.end

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            self._mtmd.mtmd_free(self._ctx)
            self._ctx = None
