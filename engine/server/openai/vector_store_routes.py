"""OpenAI's Vector Stores API on the documents store (engine/server/documents.py): stores, their
files and file batches (indexed in the background; a client polls the status, as the `openai`
client's `create_and_poll` and `upload_and_poll` do), and `/search` (hybrid retrieval).

A file batch is remembered in memory only (its files' statuses are in the store): after a restart
its id is unknown, while every file it added is still there.
"""
from __future__ import annotations

import time

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from engine.docs.retrieve import search
from engine.docs.store import new_id
from engine.server.errors import APIError
from engine.server.openai.files_routes import file_or_404
from engine.server.openai.vector_store_filters import matches
from engine.server.openai.vector_store_protocol import (AttachFile, CreateBatch, CreateStore, ModifyStore,
                                                        SearchRequest, batch_object, listing, search_page,
                                                        store_file_object, store_object)

Order = Query("desc", pattern="^(asc|desc)$")
Limit = Query(20, ge=1, le=100)


def _store_or_404(docs, store_id: str):
    s = docs.store.store(store_id)
    if s is None:
        raise APIError(404, f"No vector store found with id '{store_id}'", code="vector_store_not_found")
    return s


def _store_body(docs, s) -> dict:
    files = docs.store.store_files(s.id)
    done = [docs.store.file(sf.file_id) for sf in files if sf.status == "completed"]
    return store_object(s, files, sum(f.bytes for f in done if f is not None))


def _attach(request: Request, store_id: str, file_ids: list[str], attributes: dict | None) -> None:
    docs = request.app.state.documents
    for fid in file_ids:
        file_or_404(docs, fid)
    for fid in file_ids:
        docs.store.attach(store_id, fid, attributes)
    docs.enqueue(request.app.state, store_id, file_ids)


def build_vector_store_router() -> APIRouter:
    router = APIRouter(prefix="/v1/vector_stores")
    _store_routes(router)
    _file_routes(router)
    return router


def _store_routes(router: APIRouter) -> None:
    @router.post("")
    async def create_store(body: CreateStore, request: Request):
        docs = request.app.state.documents
        s = docs.store.create_store(body.name or "", body.metadata)
        if body.file_ids:
            _attach(request, s.id, body.file_ids, None)
        return _store_body(docs, docs.store.store(s.id))

    @router.get("")
    async def list_stores(request: Request, after: str | None = None, before: str | None = None,
                          limit: int = Limit, order: str = Order):
        docs = request.app.state.documents
        return listing([_store_body(docs, s) for s in docs.store.stores()], after, before, limit, order)

    @router.get("/{store_id}")
    async def get_store(store_id: str, request: Request):
        docs = request.app.state.documents
        return _store_body(docs, _store_or_404(docs, store_id))

    @router.post("/{store_id}")
    async def modify_store(store_id: str, body: ModifyStore, request: Request):
        docs = request.app.state.documents
        _store_or_404(docs, store_id)
        docs.store.update_store(store_id, body.name, body.metadata)
        return _store_body(docs, docs.store.store(store_id))

    @router.delete("/{store_id}")
    async def delete_store(store_id: str, request: Request):
        docs = request.app.state.documents
        _store_or_404(docs, store_id)
        docs.cancel(store_id)
        await run_in_threadpool(docs.store.delete_store, store_id)
        return {"id": store_id, "object": "vector_store.deleted", "deleted": True}

    @router.post("/{store_id}/search")
    async def search_store(store_id: str, body: SearchRequest, request: Request):
        docs = request.app.state.documents
        _store_or_404(docs, store_id)
        hits, attributes = await search_stores(request, [store_id], body.text, body.max_num_results, body.filters)
        return search_page(body.text, hits, attributes)


def _file_routes(router: APIRouter) -> None:
    batches: dict[str, tuple[str, int, list[str]]] = {}  # batch id -> (store id, created_at, file ids)

    @router.post("/{store_id}/files")
    async def attach_file(store_id: str, body: AttachFile, request: Request):
        docs = request.app.state.documents
        _store_or_404(docs, store_id)
        _attach(request, store_id, [body.file_id], body.attributes)
        return _file_body(docs, store_id, body.file_id)

    @router.get("/{store_id}/files")
    async def list_store_files(store_id: str, request: Request, after: str | None = None, before: str | None = None,
                               limit: int = Limit, order: str = Order, filter: str | None = None):
        docs = request.app.state.documents
        _store_or_404(docs, store_id)
        files = docs.store.store_files(store_id, filter)
        return listing([_file_body(docs, store_id, sf.file_id) for sf in files], after, before, limit, order)

    @router.get("/{store_id}/files/{file_id}")
    async def get_store_file(store_id: str, file_id: str, request: Request):
        docs = request.app.state.documents
        _store_or_404(docs, store_id)
        return _file_body(docs, store_id, file_id)

    @router.delete("/{store_id}/files/{file_id}")
    async def detach_file(store_id: str, file_id: str, request: Request):
        docs = request.app.state.documents
        _store_or_404(docs, store_id)
        _file_body(docs, store_id, file_id)
        docs.cancel(store_id, file_id)
        await run_in_threadpool(docs.store.detach, store_id, file_id)
        return {"id": file_id, "object": "vector_store.file.deleted", "deleted": True}

    @router.post("/{store_id}/file_batches")
    async def create_batch(store_id: str, body: CreateBatch, request: Request):
        docs = request.app.state.documents
        _store_or_404(docs, store_id)
        _attach(request, store_id, body.file_ids, body.attributes)
        batch_id = new_id("vsfb_")
        batches[batch_id] = (store_id, int(time.time()), body.file_ids)
        return _batch_body(docs, batch_id, batches)

    @router.get("/{store_id}/file_batches/{batch_id}")
    async def get_batch(store_id: str, batch_id: str, request: Request):
        if batches.get(batch_id, ("",))[0] != store_id:
            raise APIError(404, f"No file batch found with id '{batch_id}'", code="not_found")
        return _batch_body(request.app.state.documents, batch_id, batches)


def _file_body(docs, store_id: str, file_id: str) -> dict:
    sf = docs.store.store_file(store_id, file_id)
    if sf is None:
        raise APIError(404, f"No file found with id '{file_id}' in vector store '{store_id}'", code="file_not_found")
    f = docs.store.file(file_id)
    p = docs.progress.get((store_id, file_id)) if sf.status == "in_progress" else None
    return store_file_object(sf, f.bytes if f is not None and sf.status == "completed" else 0,
                             (p.chunks_done, p.chunks_total) if p is not None else None)


def _batch_body(docs, batch_id: str, batches: dict) -> dict:
    store_id, created, file_ids = batches[batch_id]
    files = [sf for fid in file_ids if (sf := docs.store.store_file(store_id, fid)) is not None]
    return batch_object(batch_id, store_id, created, files)


async def search_stores(request: Request, store_ids: list[str], query: str, top_k: int,
                        filters: dict | None = None):
    """(hits, each hit file's attributes): the stores' best chunks for the query, hybrid; with
    `filters` (OpenAI's attribute filters), only files whose attributes match."""
    docs, state = request.app.state.documents, request.app.state
    if not query.strip():
        raise APIError(400, "query is empty", code="invalid_value", param="query")
    for sid in store_ids:
        _store_or_404(docs, sid)
    vectors, embedder = await docs.embed(state, [query])
    stale = [s for sid in store_ids if (s := docs.store.store(sid)) and s.embed_model not in (None, embedder)]
    for s in stale:  # indexed by another embedding model: embedded again with this one
        file_ids = [docs.store.attach(s.id, sf.file_id).file_id for sf in docs.store.store_files(s.id)]
        docs.enqueue(state, s.id, file_ids)
    if stale:
        raise APIError(409, f"vector store {stale[0].id} was indexed with {stale[0].embed_model}, not with the "
                       f"embedding model now set ({embedder}); it is being indexed again: search once its "
                       "status is completed", code="vector_store_reindexing")
    attributes = {sf.file_id: sf.attributes for sid in store_ids for sf in docs.store.store_files(sid)}
    depth = top_k if filters is None else max(50, top_k * 5)
    hits = await run_in_threadpool(search, docs.store, store_ids, query, vectors[0], depth)
    if filters is not None:
        hits = [h for h in hits if matches(filters, attributes.get(h.file_id, {}))][:top_k]
    for sid in store_ids:
        docs.store.touch_store(sid)
    return hits, attributes
