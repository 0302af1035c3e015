"""Indexing a file into a store: convert, chunk, embed in batches, then write all its chunks at once.

Incremental by content: a file whose sha256 and embedding model match what its chunks were made
from is skipped; a changed one is indexed again (its old chunks replaced in the same transaction);
a user's file that is gone is removed with its chunks (`sync`). Cancelling (an Event) is checked
between embedding batches; the store then still holds the file's previous chunks, if any, and
the file is marked `cancelled`. A file Ember cannot read is marked `failed` with the reason in
words, and the others go on.
"""
from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.docs.chunk import chunk_sections
from engine.docs.convert import DocError, convert
from engine.docs.store import DocStore, FileRow, StoreFile

log = logging.getLogger(__name__)

Embed = Callable[[list[str]], np.ndarray]  # texts -> [n, dim] float32, L2-normalised
BATCH = 16


@dataclass(frozen=True, slots=True)
class Progress:
    file_id: str
    filename: str
    chunks_done: int
    chunks_total: int


class Cancelled(Exception):
    pass


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


class Indexer:
    """Indexes files of the store with one embedder (`embed`, named `embed_model`)."""

    def __init__(self, store: DocStore, embed: Embed, embed_model: str, batch: int = BATCH) -> None:
        self.store, self.embed, self.embed_model, self.batch = store, embed, embed_model, batch

    def add_path(self, store_id: str, path: Path) -> FileRow:
        """A file of the user's own (left where it is) in the store, not yet indexed."""
        path = path.resolve()
        f = self.store.file_by_path(path)
        if f is None:
            if not path.is_file():
                raise DocError(f"{path}: no such file")
            f = self.store.add_file(path.name, path, sha256="")
        if self.store.store_file(store_id, f.id) is None:
            self.store.attach(store_id, f.id)
        return f

    def index(self, store_id: str, file_id: str, progress: Callable[[Progress], None] | None = None,
              cancel: threading.Event | None = None) -> StoreFile:
        """Index one file of the store (or skip it, unchanged); its StoreFile afterwards."""
        f = self.store.file(file_id)
        current = self.store.store_file(store_id, file_id) or self.store.attach(store_id, file_id)
        path = Path(f.path)
        try:
            sha = f.sha256 if f.uploaded else file_sha256(path)
        except FileNotFoundError:
            return self._fail(store_id, file_id, f"{f.filename}: the file is gone (moved or deleted)")
        if current.sha256 == sha and current.embed_model == self.embed_model and current.status != "failed" \
                and current.chunks:
            if current.status != "completed":
                self.store.set_status(store_id, file_id, "completed")
            return self.store.store_file(store_id, file_id)
        if not f.uploaded and sha != f.sha256:
            self.store.update_file(file_id, path.stat().st_size, sha)
        try:
            kind, sections = convert(path, f.filename)
            chunks = chunk_sections(kind, sections)
            if not chunks:
                raise DocError(f"{f.filename} holds no text")
            vectors = self._embed_all(f, [c.text for c in chunks], progress, cancel)
        except DocError as e:
            return self._fail(store_id, file_id, str(e))
        except Cancelled:
            self.store.set_status(store_id, file_id, "cancelled", "cancelled by the user")
            return self.store.store_file(store_id, file_id)
        self.store.replace_chunks(store_id, file_id, sha, self.embed_model, chunks, vectors)
        log.info("indexed %s into %s: %d chunks", f.filename, store_id, len(chunks))
        return self.store.store_file(store_id, file_id)

    def _embed_all(self, f: FileRow, texts: list[str], progress, cancel) -> np.ndarray:
        out = []
        for i in range(0, len(texts), self.batch):
            if cancel is not None and cancel.is_set():
                raise Cancelled
            out.append(np.asarray(self.embed(texts[i:i + self.batch]), dtype=np.float32))
            if progress is not None:
                progress(Progress(f.id, f.filename, min(i + self.batch, len(texts)), len(texts)))
        return np.concatenate(out)

    def _fail(self, store_id: str, file_id: str, why: str) -> StoreFile:
        log.warning("not indexed: %s", why)
        self.store.set_status(store_id, file_id, "failed", why)
        return self.store.store_file(store_id, file_id)

    def sync(self, store_id: str, progress=None, cancel: threading.Event | None = None) -> list[StoreFile]:
        """Every file of the store brought up to date: the user's files that are gone removed with
        their chunks, changed ones (or all, after the embedder changed) indexed again."""
        out = []
        for sf in self.store.store_files(store_id):
            f = self.store.file(sf.file_id)
            if f is not None and not f.uploaded and not Path(f.path).exists():
                self.store.detach(store_id, sf.file_id)
                log.info("%s is gone: removed from %s", f.path, store_id)
                continue
            out.append(self.index(store_id, sf.file_id, progress, cancel))
        return out
