"""OpenAI's Files and Vector Stores: request shapes, and the objects as OpenAI's API returns them
(File, VectorStore, VectorStoreFile, VectorStoreFileBatch, the search results page), built from
the rows of engine/docs/store.py."""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from engine.docs.retrieve import Hit
from engine.docs.store import FileRow, StoreFile, StoreRow

_config = ConfigDict(extra="ignore", allow_inf_nan=False)
Attributes = dict[str, str | float | bool]


class CreateStore(BaseModel):
    model_config = _config
    name: str | None = None
    file_ids: Annotated[list[str], Field(max_length=500)] = []
    metadata: dict[str, str] | None = None
    expires_after: dict[str, Any] | None = None  # accepted; a local store does not expire
    chunking_strategy: dict[str, Any] | None = None  # accepted; Ember chunks by the file's structure


class ModifyStore(BaseModel):
    model_config = _config
    name: str | None = None
    metadata: dict[str, str] | None = None
    expires_after: dict[str, Any] | None = None


class AttachFile(BaseModel):
    model_config = _config
    file_id: str
    attributes: Attributes | None = None
    chunking_strategy: dict[str, Any] | None = None


class CreateBatch(BaseModel):
    model_config = _config
    file_ids: Annotated[list[str], Field(min_length=1, max_length=500)]
    attributes: Attributes | None = None
    chunking_strategy: dict[str, Any] | None = None


class SearchRequest(BaseModel):
    model_config = _config
    query: str | Annotated[list[str], Field(min_length=1)]
    max_num_results: int = Field(10, ge=1, le=50)
    filters: dict[str, Any] | None = None
    ranking_options: dict[str, Any] | None = None
    rewrite_query: bool = False

    @property
    def text(self) -> str:
        return self.query if isinstance(self.query, str) else " ".join(self.query)


def file_object(f: FileRow) -> dict:
    return {"id": f.id, "object": "file", "bytes": f.bytes, "created_at": f.created_at, "filename": f.filename,
            "purpose": f.purpose, "status": "processed", "expires_at": None, "status_details": None}


def file_counts(files: list[StoreFile]) -> dict:
    counts = {k: 0 for k in ("in_progress", "completed", "failed", "cancelled")}
    for sf in files:
        counts[sf.status] = counts.get(sf.status, 0) + 1
    return {**counts, "total": len(files)}


def store_object(s: StoreRow, files: list[StoreFile], usage_bytes: int) -> dict:
    counts = file_counts(files)
    return {"id": s.id, "object": "vector_store", "created_at": s.created_at, "name": s.name,
            "usage_bytes": usage_bytes, "file_counts": counts,
            "status": "in_progress" if counts["in_progress"] else "completed",
            "expires_after": None, "expires_at": None, "last_active_at": s.last_active_at,
            "metadata": s.metadata}


def store_file_object(sf: StoreFile, usage_bytes: int, progress: tuple[int, int] | None = None) -> dict:
    """`progress` (chunks embedded, chunks in all) while it indexes: an Ember extension the window
    shows as a progress bar with the time left."""
    error = None
    if sf.status == "failed":
        error = {"code": "unsupported_file" if "not supported" in (sf.error or "") else "server_error",
                 "message": sf.error or "indexing failed"}
    return {"id": sf.file_id, "object": "vector_store.file", "created_at": sf.created_at,
            "vector_store_id": sf.store_id, "status": sf.status, "last_error": error, "usage_bytes": usage_bytes,
            "chunking_strategy": {"type": "static", "static": {"max_chunk_size_tokens": 250,
                                                                "chunk_overlap_tokens": 0}},
            "attributes": sf.attributes,
            **({"chunks": sf.chunks} if sf.status == "completed" else {}),  # Ember: passages indexed
            **({"progress": {"chunks_done": progress[0], "chunks_total": progress[1]}} if progress else {})}


def batch_object(batch_id: str, store_id: str, created_at: int, files: list[StoreFile]) -> dict:
    counts = file_counts(files)
    return {"id": batch_id, "object": "vector_store.files_batch", "created_at": created_at,
            "vector_store_id": store_id, "status": "in_progress" if counts["in_progress"] else "completed",
            "file_counts": counts}


def search_page(query: str, hits: list[Hit], attributes: dict[str, dict]) -> dict:
    return {"object": "vector_store.search_results.page", "search_query": [query],
            "data": [{"file_id": h.file_id, "filename": h.filename, "score": round(h.score, 6),
                      "attributes": {**attributes.get(h.file_id, {}), "location": h.location},
                      "content": [{"type": "text", "text": h.text}]} for h in hits],
            "has_more": False, "next_page": None}


def listing(items: list[dict], after: str | None, before: str | None, limit: int, order: str) -> dict:
    """OpenAI's cursor page over a list ordered by creation: `after`/`before` an id in it."""
    items = items if order == "asc" else items[::-1]
    ids = [x["id"] for x in items]
    if after in ids:
        items = items[ids.index(after) + 1:]
    elif before in ids:
        items = items[:ids.index(before)]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}
