"""The documents store and its embedder in this process, for `ember docs`, `ember chat --docs` and
`ember bench rag`: the same database the app's engine uses (`<data_dir>/documents/documents.sqlite3`;
SQLite's WAL lets both write, each waiting on the other's transaction), and the embedding model
run by llama.cpp as the engine runs it (engine/server/embeddings.py's `Embedder`: one input a
decode, mean or the file's own pooling, the first tokens of an input longer than its context, L2
normalised), so vectors made here and there are the same and a collection can be searched by either.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.settings import Settings



class NoEmbedder(SystemExit):
    """No embedding model to use, with what to do about it."""


@dataclass(frozen=True, slots=True)
class EmbeddingModel:
    id: str  # what the store records as the model that built a collection
    path: str
    context_length: int | None


def open_store(settings: Settings):
    from engine.docs.store import DB_NAME, DocStore

    return DocStore(settings.docs_dir / DB_NAME)


def _installed(settings: Settings):
    from app.store import ModelStore

    return ModelStore(settings.models_dir).list()


def _is_embedder(m) -> bool:
    from engine.model_files.architectures import embeds_only

    return m.format == "gguf" and embeds_only(m.architecture)


def embedding_model(settings: Settings, wanted: str | None = None, collection_model: str | None = None,
                    prefer_collection: bool = False) -> EmbeddingModel:
    """The embedder: `wanted` (--embedding-model: an installed id or a GGUF file), else (searching,
    `prefer_collection`) the model that built the collection, else settings.embedding_model, else the
    collection's model, else the first installed embedding model; NoEmbedder says how to get one."""
    models = {m.id: m for m in _installed(settings)}
    order = [wanted] if wanted else []
    order += [collection_model] if prefer_collection else []
    order += [settings.embedding_model, collection_model]
    for name in [n for n in order if n]:
        if name in models:
            m = models[name]
            return EmbeddingModel(m.id, m.path, m.context_length)
        if name == wanted and Path(name).expanduser().is_file():
            return _from_file(Path(name).expanduser())
        if name == wanted:
            raise NoEmbedder(f"error: --embedding-model {name}: no such file, and no installed model has this id "
                             "(`ember models list` shows them)")
    for m in models.values():
        if _is_embedder(m):
            return EmbeddingModel(m.id, m.path, m.context_length)
    raise NoEmbedder("error: no embedding model is installed: documents need one to index and search. Import "
                     "one with `ember models import FOLDER` (a sentence-transformers folder such as "
                     "all-MiniLM-L6-v2) or pass --embedding-model FILE.gguf")


def _from_file(path: Path) -> EmbeddingModel:
    """A GGUF named by its path: its id is the engine's for `--embedding-model FILE` (the file's name)."""
    from engine.model_files.manifest import slugify
    from engine.model_files.meta import read_meta

    return EmbeddingModel(slugify(path.stem), str(path.resolve()), read_meta(path).context_length)


class LocalEmbedder:
    """texts -> [n, dim] float32, L2-normalised (the Indexer's and retrieve.search's `embed`); the
    model is loaded on the first call, so a run that embeds nothing never loads it."""

    def __init__(self, model: EmbeddingModel, threads: int | None = None) -> None:
        self.model, self.threads = model, threads or os.cpu_count() or 1
        from engine.model_files.footprint import default_context
        from engine.server.embeddings import MAX_CONTEXT

        self.n_ctx = min(default_context(model.context_length or 512), MAX_CONTEXT)  # the engine's context
        self._embedder = None

    def _load(self):
        from engine.server.embeddings import Embedder

        if self._embedder is None:
            from llama_cpp import _logger  # llama.cpp's log callback: quiet unless -v

            _logger.set_verbose(logging.getLogger().isEnabledFor(logging.DEBUG))
            e = Embedder(self.model.path, self.n_ctx, self.threads)
            if e.ranker:
                e.close()
                raise NoEmbedder(f"error: {self.model.id} is a reranker (it scores pairs), not an embedding model")
            self._embedder = e
        return self._embedder

    def __call__(self, texts: list[str]) -> np.ndarray:
        from engine.server.embeddings import l2_normalize

        e = self._load()
        out = []
        for text in texts:
            ids = e.tokenize(text)[:self.n_ctx]  # as the engine's truncate: the first tokens
            out.append(l2_normalize(e.embed(ids)))
        return np.stack(out)

    def close(self) -> None:
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None


def collection(store, name: str, create: bool = False):
    """The collection (vector store) named `name`, or its id; a new one when `create`."""
    s = store.store(name) or store.store_named(name)
    if s is None and create:
        s = store.create_store(name)
    return s


def forget(store, store_id: str, file_id: str) -> None:
    """A user's file out of a collection; its file row too when no other collection holds it."""
    store.detach(store_id, file_id)
    others = store.db.execute("SELECT COUNT(*) FROM store_files WHERE file_id=?", (file_id,)).fetchone()[0]
    f = store.file(file_id)
    if not others and f is not None and not f.uploaded:
        store.delete_file(file_id)
