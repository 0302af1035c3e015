"""The engine's documents (app.state.documents): the store the window and OpenAI's Files and
Vector Stores API share, the embedding model that indexes and searches it, and one indexing thread.

The embedder is a model like any other: named by `--embedding-model` (an installed id or name),
else the first installed embedding-only model, loaded just in time beside the chat models and
held only while a batch embeds. Indexing runs on one thread of its own, a file at a time, in the
order files were added; its embedding batches are background work (engine/server/embeddings.py:
they wait while a chat has a reply running), so a long PDF never slows a reply. The thread posts
each batch to the server's event loop, where the model is acquired as a request would.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.docs.indexer import Indexer, Progress
from engine.docs.store import DB_NAME, DocStore
from engine.model_files.architectures import embeds_only
from engine.model_files.meta import read_meta
from engine.server.embeddings import l2_normalize
from engine.server.errors import APIError
from engine.server.model_store import spec_from_path
from engine.server.model_use import acquire, resolve
from engine.service.handle import KEEP_DEFAULT
from engine.service.served_model import ModelSpec

log = logging.getLogger(__name__)


class Documents:
    def __init__(self, root: str | Path | None, embedding_model: str | None = None) -> None:
        self.root = Path(root) if root else None
        self.embedding_model = embedding_model
        self._store: DocStore | None = None
        self._jobs: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None
        self._cancel: dict[tuple[str, str], threading.Event] = {}
        self.progress: dict[tuple[str, str], Progress] = {}  # the file being indexed, per store
        self._lock = threading.Lock()

    @property
    def store(self) -> DocStore:
        if self.root is None:
            raise APIError(404, "this server keeps no documents: start it with --docs-dir (the desktop app "
                           "and `ember serve` do)", code="documents_unavailable")
        with self._lock:
            if self._store is None:
                self._store = DocStore(self.root / DB_NAME)
            return self._store

    def embedder(self, state) -> ModelSpec:
        """The model that embeds documents and queries: the configured one, else the first installed
        embedding-only model; a 400 in words when there is none."""
        if self.embedding_model and Path(self.embedding_model).expanduser().is_file():  # --embedding-model PATH
            return spec_from_path(self.embedding_model)
        if self.embedding_model:
            return resolve(state.engine_thread, state.model_store, None, self.embedding_model)
        for spec in state.model_store.list():
            try:
                if spec.format == "gguf" and embeds_only(read_meta(Path(spec.path)).architecture):
                    return spec
            except (OSError, ValueError):
                continue
        raise APIError(400, "no embedding model is installed: documents need one to index and search "
                       "(install all-MiniLM-L6-v2 from the catalog, or `ember models import FOLDER` a "
                       "sentence-transformers model) or start the server with --embedding-model",
                       code="no_embedding_model")

    async def embed(self, state, texts: list[str], background: bool = False,
                    spec: ModelSpec | None = None) -> tuple[np.ndarray, str]:
        """(L2-normalised vectors [n, dim], the embedder's id: `spec`, else `embedder`'s). Inputs longer
        than the embedder's context keep their first tokens (a chunk is sized to fit; a long query is cut)."""
        spec = spec or self.embedder(state)
        thread = state.engine_thread
        loaded = await acquire(thread, spec, KEEP_DEFAULT)
        try:
            res = await state.embeddings.run(thread, loaded, texts, truncate=True, background=background)
        finally:
            thread.release(spec.id)
        return np.stack([l2_normalize(v) for v in res.vectors]), spec.id

    # -- indexing (one thread; files in the order they came)
    def enqueue(self, state, store_id: str, file_ids: list[str],
                on_done: Callable[[str, str], None] | None = None) -> None:
        loop = asyncio.get_running_loop()
        for fid in file_ids:
            self._cancel[(store_id, fid)] = threading.Event()
            self._jobs.put((state, loop, store_id, fid, on_done))
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="ember-indexer", daemon=True)
            self._worker.start()

    def resume(self, state) -> None:
        """Files left `in_progress` by an engine that stopped while indexing are indexed again (the
        store still holds their previous chunks, if any: a file's chunks are written at once)."""
        if self.root is None or not (self.root / DB_NAME).exists():
            return
        for s in self.store.stores():
            left = [sf.file_id for sf in self.store.store_files(s.id, "in_progress")]
            if left:
                log.info("indexing %d file(s) of %s again: the engine stopped before they were done", len(left), s.id)
                self.enqueue(state, s.id, left)

    def cancel(self, store_id: str, file_id: str | None = None) -> None:
        for (sid, fid), ev in list(self._cancel.items()):
            if sid == store_id and (file_id is None or fid == file_id):
                ev.set()

    def _work(self) -> None:
        """The indexing thread, for the server's life (one that left when idle could leave just as
        a job came, and the job would wait for the next one)."""
        while (job := self._jobs.get()) is not None:
            state, loop, store_id, file_id, on_done = job
            try:
                self._index_one(state, loop, store_id, file_id)
            except Exception:  # noqa: BLE001 - one file's failure must not stop the others
                log.exception("indexing %s into %s failed", file_id, store_id)
                self.store.set_status(store_id, file_id, "failed", "indexing failed (see the engine's log)")
            finally:
                self._cancel.pop((store_id, file_id), None)
                self.progress.pop((store_id, file_id), None)
            if on_done is not None:
                on_done(store_id, file_id)

    def _index_one(self, state, loop, store_id: str, file_id: str) -> None:
        cancel = self._cancel.get((store_id, file_id)) or threading.Event()
        if cancel.is_set() or self.store.store_file(store_id, file_id) is None:
            return  # cancelled or removed while it waited
        try:
            spec = self.embedder(state)
        except APIError as e:
            self.store.set_status(store_id, file_id, "failed", e.message)
            return

        def embed(texts: list[str]) -> np.ndarray:
            job = self.embed(state, texts, background=True, spec=spec)
            return asyncio.run_coroutine_threadsafe(job, loop).result()[0]
        indexer = Indexer(self.store, embed, spec.id)
        indexer.index(store_id, file_id, lambda p: self.progress.__setitem__((store_id, file_id), p), cancel)

    def close(self) -> None:
        """At the server's end, on its event loop. A file being indexed is not cancelled (that would
        mark it `cancelled`, the user's word): it stays `in_progress`, its previous chunks whole, and
        the next start indexes it again (`resume`). The thread is not joined: it may wait on this loop."""
        self._jobs.put(None)
        if self._store is not None and not self.progress:  # a file being indexed still writes its status
            self._store.close()
