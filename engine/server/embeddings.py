"""Embeddings of the loaded model (OpenAI's /v1/embeddings, Ollama's /api/embed and /api/embeddings).

On Ember's engine (a runner that pools, engine/runner.py) each input is a sequence of the same
scheduler as the chats: its prompt runs in the same forward passes, batched with them, and the
mean of its final hidden states is the vector (llama.cpp's mean pooling of t_embd). No prefix
cache serves it: every row is pooled.

Otherwise (the llama.cpp runner, or a file that names its own pooling: CLS, last token, a
reranker's rank head), the vectors come from llama.cpp: one embeddings-only context on the loaded
model's GGUF file, built on the first request and rebuilt when another model is loaded. It does
not share the chats' engine thread or KV pool: a request holds `Embeddings.lock` and runs in the
thread pool, one input per decode, its cells cleared before each.

Pooling is the file's `{arch}.pooling_type` when it names one, else mean over the input's tokens
(a chat model's file names none). The context is the served max_model_len, at most MAX_CONTEXT
tokens on llama.cpp; an input longer than it is a 400 naming the input (Ollama's `truncate`, its
default, keeps the first tokens instead). At most MAX_INPUTS inputs.
"""
from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass

import numpy as np
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from engine.model_files.gguf_file import GGUFFile
from engine.sampling_params import SamplingParams
from engine.server.openai import bodies as R
from engine.service.handle import EngineHandle
from engine.service.served_model import LoadedModel
from engine.server.errors import APIError
from engine.server.serving import Job

MAX_INPUTS = 256
MAX_CONTEXT = 8192  # an embeddings context's own KV: no larger than this whatever the chats get
POOLING = {1: "mean", 2: "cls", 3: "last"}  # llama.cpp's enum llama_pooling_type
MEAN = 1
YIELD_POLL_S = 0.02  # how often background embedding looks whether the chats are done
RANK = 4  # a cross-encoder reranker's head: one score per (query, document) pair, not a vector


def chats_running(thread: EngineHandle) -> bool:
    """Whether a model that generates has requests in its engine (the status the engine thread
    publishes after every step, so this is safe from any thread)."""
    return any(m.running and m.model is not None and m.model.generates for m in thread.models)


def l2_normalize(v: np.ndarray) -> np.ndarray:
    """v / |v| (a zero vector stays zero): what llama.cpp's server (--embd-normalize 2, its
    default) and Ollama's /api/embed return, so that a dot product is the cosine similarity."""
    n = float(np.linalg.norm(v.astype(np.float64)))
    return v if n == 0.0 else (v / n).astype(np.float32)


class Embedder:
    """A llama.cpp model and context in embeddings mode on one GGUF file (build, embed, close)."""

    def __init__(self, path: str, n_ctx: int, threads: int) -> None:
        import llama_cpp as ll

        self._ll = ll
        ll.llama_backend_init()
        self.model = ll.llama_model_load_from_file(path.encode(), ll.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path} for embeddings")
        self.vocab = ll.llama_model_get_vocab(self.model)
        self.n_embd = ll.llama_model_n_embd(self.model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.n_ctx = n_ctx
        arch = self._meta("general.architecture")
        pooling = self._meta(f"{arch}.pooling_type") if arch else None
        self.ranker = pooling == str(RANK)
        self.pooling = int(pooling) if pooling and pooling.isdigit() and int(pooling) in POOLING else MEAN
        p = ll.llama_context_default_params()
        p.n_ctx = p.n_batch = p.n_ubatch = n_ctx  # one input, one ubatch: pooled as a whole
        p.n_seq_max = 1
        p.embeddings = True
        p.pooling_type = self.pooling
        p.n_threads = p.n_threads_batch = threads
        p.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as llama-cpp-python's Llama: the same sums
        self.ctx = ll.llama_init_from_model(self.model, p)
        if not self.ctx:
            ll.llama_model_free(self.model)
            raise MemoryError(f"llama.cpp could not create an embeddings context of {n_ctx} tokens")
        self.batch = ll.llama_batch_init(n_ctx, 0, 1)

    def _meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = self._ll.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode() if n >= 0 else None

    def tokenize(self, text: str) -> list[int]:
        """As llama-cpp-python's `Llama.tokenize(text)`: BOS if the vocabulary adds one, special
        tokens' text left as text."""
        data = text.encode()
        size = len(data) + 8
        while True:
            buf = (self._ll.llama_token * size)()
            n = self._ll.llama_tokenize(self.vocab, data, len(data), buf, size, True, False)
            if n >= 0:
                return list(buf[:n])
            size = -n

    def embed(self, ids: list[int]) -> np.ndarray:
        """The pooled (not normalized) embedding of one input of 1..n_ctx token ids."""
        ll, b = self._ll, self.batch
        for i, t in enumerate(ids):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, i, 1, 1
            b.seq_id[i][0] = 0
        b.n_tokens = len(ids)
        ll.llama_memory_clear(ll.llama_get_memory(self.ctx), True)
        if ll.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama.cpp failed to decode an embeddings input")
        ptr = ll.llama_get_embeddings_seq(self.ctx, 0)
        if not ptr:
            raise RuntimeError("llama.cpp returned no pooled embedding")
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).astype(np.float32)

    def close(self) -> None:
        if self.ctx:
            self._ll.llama_batch_free(self.batch)
            self._ll.llama_free(self.ctx)
            self._ll.llama_model_free(self.model)
            self.ctx = None


@dataclass(frozen=True, slots=True)
class EmbedResult:
    vectors: list[np.ndarray]  # pooled, not normalized: each route decides
    num_tokens: list[int]
    load_seconds: float  # building the embedder, when this request did
    ranker: bool = False  # the file is a cross-encoder reranker (rank pooling), not an embedder


def plan_inputs(inputs, tokenize, n_vocab: int, n_ctx: int, truncate: bool) -> list[list[int]]:
    """Each input's token ids (a string tokenized, ids checked), or a 400 naming the input."""
    plans = []
    for i, x in enumerate(inputs):
        ids = tokenize(x) if isinstance(x, str) else list(x)
        where = "input" if len(inputs) == 1 else f"input[{i}]"
        if not ids:
            raise APIError(400, f"{where} is empty (no tokens)", code="invalid_value", param="input")
        bad = next((t for t in ids if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise APIError(400, f"{where}: token id {bad} is outside the vocabulary (size {n_vocab})",
                           code="invalid_value", param="input")
        if len(ids) > n_ctx:
            if not truncate:
                raise APIError(400, f"{where} is {len(ids)} tokens, more than the {n_ctx} tokens of "
                               "this model's embeddings context; shorten it or split it",
                               code="context_length_exceeded", param="input")
            ids = ids[:n_ctx]
        plans.append(ids)
    return plans


def check_dimensions(dimensions: int | None, size: int) -> None:
    """No model here is trained to be cut short (Matryoshka): only its own size is accepted."""
    if dimensions is not None and dimensions != size:
        raise APIError(400, f"dimensions {dimensions} is not supported: this model's embeddings have "
                       f"{size} dimensions (omit it or pass {size})", code="invalid_value", param="dimensions")



_pooling: dict[str, int | None] = {}  # GGUF path -> its {arch}.pooling_type (None: names none)


def file_pooling(path: str) -> int | None:
    if path not in _pooling:
        f = GGUFFile(path)
        value = f.get(f"{f.get('general.architecture')}.pooling_type")
        _pooling[path] = int(value) if value is not None else None
    return _pooling[path]


async def pool_on_engine(thread: EngineHandle, request: Request | None, loaded: LoadedModel, inputs,
                         truncate: bool) -> EmbedResult:
    """Each input a sequence of the chats' scheduler, mean-pooled by the runner (see the docstring)."""
    engine = loaded.engine
    tok = engine.tokenizer
    plans = await run_in_threadpool(plan_inputs, inputs, lambda s: tok.encode(s, parse_special=False),
                                    tok.vocab_size, engine.max_model_len, truncate)
    job, vectors, rid = Job(thread, request), [None] * len(plans), R.new_id("embd")
    try:
        for i, ids in enumerate(plans):  # background work: a chat's next token goes first
            job.submit(ids, SamplingParams(max_tokens=1, embed=True, priority=1), f"{rid}-{i}", engine)
        async for rid, out in job:
            if out.finished:
                if out.embedding is None:
                    raise APIError(400, f"input[{rid.rsplit('-', 1)[1]}] does not fit the KV pool",
                                   code="context_length_exceeded", param="input")
                vectors[int(rid.rsplit("-", 1)[1])] = np.asarray(out.embedding, dtype=np.float32)
    finally:
        job.close()
    return EmbedResult(vectors, [len(ids) for ids in plans], 0.0)


class Embeddings:
    """The app's one Embedder (app.state.embeddings), for whichever model is loaded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._embedder: Embedder | None = None
        self._key: tuple | None = None

    async def run(self, thread: EngineHandle, loaded: LoadedModel, inputs: list[str | list[int]],
                  truncate: bool = False, request: Request | None = None, background: bool = False) -> EmbedResult:
        """`request`: the HTTP call whose hanging up aborts the work (None: nobody's). `background`
        (indexing documents): on llama.cpp, each input waits while a chat has a reply running, so
        that the two never share the cores; on Ember's engine the scheduler's priority does that."""
        spec = loaded.spec
        gguf = spec.format == "gguf" and not os.path.isdir(spec.path)
        if not inputs:
            raise APIError(400, "input is empty: give a string or a list of them", code="invalid_value", param="input")
        if len(inputs) > MAX_INPUTS:
            raise APIError(400, f"at most {MAX_INPUTS} inputs per request (got {len(inputs)})",
                           code="invalid_value", param="input")
        if (loaded.engine.runner.pools_embeddings
                and (not gguf or await run_in_threadpool(file_pooling, spec.path) in (None, MEAN))):
            return await pool_on_engine(thread, request, loaded, inputs, truncate)
        if not gguf:
            raise APIError(400, f"embeddings of a {spec.format} model need Ember's engine; the loaded model "
                           f"{spec.id!r} runs on {loaded.backend} (load it with the torch backend, or load a "
                           "GGUF file)", code="invalid_model", param="model")
        n_ctx = min(loaded.engine.max_model_len, MAX_CONTEXT)
        threads = loaded.engine.config.num_threads or os.cpu_count() or 1
        wait = (lambda: chats_running(thread)) if background else None
        return await run_in_threadpool(self._run, spec.path, n_ctx, threads, inputs, truncate, wait)

    def _run(self, path: str, n_ctx: int, threads: int, inputs, truncate: bool, wait) -> EmbedResult:
        with self.lock:
            t0 = time.monotonic()
            e = self._embedder_for(path, n_ctx, threads)
            load = time.monotonic() - t0
            plans = plan_inputs(inputs, e.tokenize, e.n_vocab, n_ctx, truncate)
            vectors = []
            for ids in plans:
                while wait is not None and wait():
                    time.sleep(YIELD_POLL_S)
                vectors.append(e.embed(ids))
            return EmbedResult(vectors, [len(ids) for ids in plans], load, e.ranker)

    def _embedder_for(self, path: str, n_ctx: int, threads: int) -> Embedder:
        key = (path, n_ctx, threads)
        if self._key != key:
            self.close()
            self._embedder, self._key = Embedder(path, n_ctx, threads), key
        return self._embedder

    def close(self) -> None:
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = self._key = None
