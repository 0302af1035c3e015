"""The documents store: one SQLite database (`documents.sqlite3` in the data folder) opened with
apsw, which bundles SQLite with extension loading and FTS5 (Python's own sqlite3 often cannot
load extensions), and sqlite-vec loaded into it. No fallback: without them the store refuses to open.

Tables: `files` (OpenAI's File objects: an upload kept in the store's folder, or a file of the
user's own left where it is), `stores` (vector stores, the window's collections; each records
the embedding model and dimension that built it), `store_files` (a file in a store: its status,
content hash and chunk count), `chunks` (text and location), `chunks_fts` (FTS5, porter stemming:
BM25) and one `vec_<dim>` vec0 table per embedding size (cosine distance, the store's number as
its partition key, so a search reads one store's vectors only). A chunk's rowid is the same in
all three. Writes of one file's chunks are one transaction: a cancelled or crashed indexing
leaves the file's old chunks or its new ones, never half.
"""
from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.docs.chunk import Chunk

DB_NAME = "documents.sqlite3"  # in the data folder's documents/: the engine and the CLI open the same one

SCHEMA = """
CREATE TABLE IF NOT EXISTS files(id TEXT PRIMARY KEY, filename TEXT NOT NULL, bytes INTEGER NOT NULL,
    sha256 TEXT NOT NULL, purpose TEXT NOT NULL, created_at INTEGER NOT NULL, path TEXT NOT NULL,
    uploaded INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS stores(id TEXT PRIMARY KEY, num INTEGER UNIQUE NOT NULL, name TEXT NOT NULL,
    created_at INTEGER NOT NULL, last_active_at INTEGER NOT NULL, embed_model TEXT, dim INTEGER,
    metadata TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS store_files(store_id TEXT NOT NULL, file_id TEXT NOT NULL, status TEXT NOT NULL,
    error TEXT, sha256 TEXT, embed_model TEXT, chunks INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL,
    attributes TEXT NOT NULL DEFAULT '{}', PRIMARY KEY(store_id, file_id));
CREATE TABLE IF NOT EXISTS chunks(id INTEGER PRIMARY KEY, store_id TEXT NOT NULL, file_id TEXT NOT NULL,
    ordinal INTEGER NOT NULL, location TEXT NOT NULL, text TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_by_file ON chunks(store_id, file_id);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(text, tokenize='porter unicode61');
"""


@dataclass(frozen=True, slots=True)
class FileRow:
    id: str
    filename: str
    bytes: int
    sha256: str
    purpose: str
    created_at: int
    path: str
    uploaded: bool  # the store keeps its own copy (an upload); else the user's file where it is


@dataclass(frozen=True, slots=True)
class StoreRow:
    id: str
    num: int
    name: str
    created_at: int
    last_active_at: int
    embed_model: str | None
    dim: int | None
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StoreFile:
    store_id: str
    file_id: str
    status: str  # in_progress, completed, failed, cancelled (OpenAI's vector store file statuses)
    error: str | None
    sha256: str | None  # of the content its chunks were made from
    embed_model: str | None
    chunks: int
    created_at: int
    attributes: dict = field(default_factory=dict)


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


class DocStore:
    """The store's one connection (apsw serializes its use across threads) and its queries."""

    def __init__(self, path: Path) -> None:
        import apsw
        import sqlite_vec

        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.files_dir = path.parent / "files"
        self.db = apsw.Connection(str(path))
        self.db.enable_load_extension(True)
        self.db.load_extension(sqlite_vec.loadable_path())
        self.db.enable_load_extension(False)
        self.db.setbusytimeout(10_000)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(SCHEMA)
        self.lock = threading.RLock()  # one transaction at a time from this process's threads

    def close(self) -> None:
        self.db.close()

    def _rows(self, sql: str, args=()) -> list[tuple]:
        return self.db.execute(sql, args).fetchall()

    # -- files
    def add_file(self, filename: str, path: Path, sha256: str, purpose: str = "assistants",
                 uploaded: bool = False, file_id: str | None = None) -> FileRow:
        row = FileRow(file_id or new_id("file-"), filename, path.stat().st_size, sha256, purpose,
                      int(time.time()), str(path), uploaded)
        with self.lock:
            self.db.execute("INSERT INTO files VALUES(?,?,?,?,?,?,?,?)", (
                row.id, row.filename, row.bytes, row.sha256, row.purpose, row.created_at, row.path, int(uploaded)))
        return row

    def file(self, file_id: str) -> FileRow | None:
        rows = self._rows("SELECT * FROM files WHERE id=?", (file_id,))
        return FileRow(*rows[0][:7], bool(rows[0][7])) if rows else None

    def files(self, purpose: str | None = None) -> list[FileRow]:
        rows = self._rows("SELECT * FROM files WHERE ?1 IS NULL OR purpose=?1 ORDER BY created_at, rowid", (purpose,))
        return [FileRow(*r[:7], bool(r[7])) for r in rows]

    def file_by_path(self, path: Path) -> FileRow | None:
        rows = self._rows("SELECT * FROM files WHERE path=? AND uploaded=0", (str(path),))
        return FileRow(*rows[0][:7], bool(rows[0][7])) if rows else None

    def update_file(self, file_id: str, size: int, sha256: str) -> None:
        with self.lock:
            self.db.execute("UPDATE files SET bytes=?, sha256=? WHERE id=?", (size, sha256, file_id))

    def delete_file(self, file_id: str) -> bool:
        """The file, its chunks in every store and, for an upload, the store's copy of its bytes."""
        f = self.file(file_id)
        if f is None:
            return False
        with self.lock, self.db:
            for (store_id,) in self._rows("SELECT store_id FROM store_files WHERE file_id=?", (file_id,)):
                self._drop_chunks(store_id, file_id)
            self.db.execute("DELETE FROM store_files WHERE file_id=?", (file_id,))
            self.db.execute("DELETE FROM files WHERE id=?", (file_id,))
        if f.uploaded:
            Path(f.path).unlink(missing_ok=True)
        return True

    # -- stores
    def create_store(self, name: str, metadata: dict | None = None) -> StoreRow:
        now = int(time.time())
        with self.lock:
            num = self._rows("SELECT COALESCE(MAX(num), 0) + 1 FROM stores")[0][0]
            row = StoreRow(new_id("vs_"), num, name, now, now, None, None, metadata or {})
            self.db.execute("INSERT INTO stores VALUES(?,?,?,?,?,?,?,?)",
                            (row.id, num, name, now, now, None, None, json.dumps(row.metadata)))
        return row

    def store(self, store_id: str) -> StoreRow | None:
        rows = self._rows("SELECT * FROM stores WHERE id=?", (store_id,))
        return StoreRow(*rows[0][:7], json.loads(rows[0][7])) if rows else None

    def store_named(self, name: str) -> StoreRow | None:
        rows = self._rows("SELECT id FROM stores WHERE name=? ORDER BY num LIMIT 1", (name,))
        return self.store(rows[0][0]) if rows else None

    def stores(self) -> list[StoreRow]:
        return [StoreRow(*r[:7], json.loads(r[7])) for r in self._rows("SELECT * FROM stores ORDER BY num")]

    def update_store(self, store_id: str, name: str | None = None, metadata: dict | None = None) -> None:
        with self.lock:
            if name is not None:
                self.db.execute("UPDATE stores SET name=? WHERE id=?", (name, store_id))
            if metadata is not None:
                self.db.execute("UPDATE stores SET metadata=? WHERE id=?", (json.dumps(metadata), store_id))

    def touch_store(self, store_id: str) -> None:
        with self.lock:
            self.db.execute("UPDATE stores SET last_active_at=? WHERE id=?", (int(time.time()), store_id))

    def delete_store(self, store_id: str) -> bool:
        if self.store(store_id) is None:
            return False
        with self.lock, self.db:
            for (file_id,) in self._rows("SELECT file_id FROM store_files WHERE store_id=?", (store_id,)):
                self._drop_chunks(store_id, file_id)
            self.db.execute("DELETE FROM store_files WHERE store_id=?", (store_id,))
            self.db.execute("DELETE FROM stores WHERE id=?", (store_id,))
        return True

    # -- a file in a store
    def attach(self, store_id: str, file_id: str, attributes: dict | None = None) -> StoreFile:
        with self.lock:
            self.db.execute("INSERT INTO store_files(store_id, file_id, status, created_at, attributes) "
                            "VALUES(?,?,'in_progress',?,?) ON CONFLICT DO UPDATE SET status='in_progress', "
                            "error=NULL", (store_id, file_id, int(time.time()), json.dumps(attributes or {})))
        return self.store_file(store_id, file_id)

    def store_file(self, store_id: str, file_id: str) -> StoreFile | None:
        rows = self._rows("SELECT store_id, file_id, status, error, sha256, embed_model, chunks, created_at, "
                          "attributes FROM store_files WHERE store_id=? AND file_id=?", (store_id, file_id))
        return StoreFile(*rows[0][:8], json.loads(rows[0][8])) if rows else None

    def store_files(self, store_id: str, status: str | None = None) -> list[StoreFile]:
        rows = self._rows("SELECT store_id, file_id, status, error, sha256, embed_model, chunks, created_at, "
                          "attributes FROM store_files WHERE store_id=?1 AND (?2 IS NULL OR status=?2) "
                          "ORDER BY created_at, rowid", (store_id, status))
        return [StoreFile(*r[:8], json.loads(r[8])) for r in rows]

    def set_status(self, store_id: str, file_id: str, status: str, error: str | None = None) -> None:
        with self.lock:
            self.db.execute("UPDATE store_files SET status=?, error=? WHERE store_id=? AND file_id=?",
                            (status, error, store_id, file_id))

    def detach(self, store_id: str, file_id: str) -> bool:
        with self.lock, self.db:
            self._drop_chunks(store_id, file_id)
            self.db.execute("DELETE FROM store_files WHERE store_id=? AND file_id=?", (store_id, file_id))
            return self.db.changes() > 0

    def replace_chunks(self, store_id: str, file_id: str, sha256: str, embed_model: str,
                       chunks: list[Chunk], vectors: np.ndarray) -> None:
        """The file's chunks in the store, all at once: the old ones go in the same transaction."""
        store = self.store(store_id)
        dim = int(vectors.shape[1]) if len(chunks) else store.dim
        with self.lock, self.db:
            self._drop_chunks(store_id, file_id)  # from the vectors table of the store's old embedder
            if dim and (store.embed_model != embed_model or store.dim != dim):
                self.db.execute("UPDATE stores SET embed_model=?, dim=? WHERE id=?", (embed_model, dim, store_id))
                self._vec_table(dim)
            for i, (c, v) in enumerate(zip(chunks, vectors)):
                self.db.execute("INSERT INTO chunks(store_id, file_id, ordinal, location, text) VALUES(?,?,?,?,?)",
                                (store_id, file_id, i, c.location, c.text))
                rowid = self.db.last_insert_rowid()
                self.db.execute("INSERT INTO chunks_fts(rowid, text) VALUES(?,?)", (rowid, c.text))
                self.db.execute(f"INSERT INTO vec_{dim}(rowid, store, embedding) VALUES(?,?,?)",
                                (rowid, store.num, np.ascontiguousarray(v, dtype=np.float32).tobytes()))
            self.db.execute("UPDATE store_files SET status='completed', error=NULL, sha256=?, embed_model=?, "
                            "chunks=? WHERE store_id=? AND file_id=?",
                            (sha256, embed_model, len(chunks), store_id, file_id))

    def _vec_table(self, dim: int) -> None:
        self.db.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS vec_{int(dim)} USING vec0(store integer partition key, "
                        f"embedding float[{int(dim)}] distance_metric=cosine)")

    def vec_tables(self) -> list[str]:
        """vec_<dim> for every embedding size indexed so far (not vec0's own shadow tables)."""
        names = self._rows("SELECT name FROM sqlite_master WHERE name GLOB 'vec_[0-9]*'")
        return [n for (n,) in names if n[4:].isdigit()]

    def _drop_chunks(self, store_id: str, file_id: str) -> None:
        """A file's chunks in a store, from every table (a store's vectors may be of an embedder
        it had before, not yet all embedded again)."""
        ids = [(r[0],) for r in self._rows("SELECT id FROM chunks WHERE store_id=? AND file_id=?", (store_id, file_id))]
        self.db.executemany("DELETE FROM chunks_fts WHERE rowid=?", ids)
        for table in self.vec_tables():
            self.db.executemany(f"DELETE FROM {table} WHERE rowid=?", ids)
        self.db.execute("DELETE FROM chunks WHERE store_id=? AND file_id=?", (store_id, file_id))
