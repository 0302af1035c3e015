"""OpenAI's Files API on the documents store: POST /v1/files (multipart, as the `openai` client
uploads), GET /v1/files[/{id}[/content]], DELETE /v1/files/{id}.

An upload is streamed to `<docs>/files/<id>` (mode 0600: the user's data) with its sha256
computed on the way; deleting a file removes its chunks from every vector store.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from engine.docs.store import new_id
from engine.server.errors import APIError
from engine.server.openai.vector_store_protocol import file_object, listing

PURPOSES = frozenset({"assistants", "batch", "fine-tune", "vision", "user_data", "evals"})


def _save(upload: UploadFile, dest: Path) -> str:
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        while block := upload.file.read(1 << 20):
            h.update(block)
            out.write(block)
    return h.hexdigest()


def file_or_404(docs, file_id: str):
    f = docs.store.file(file_id)
    if f is None:
        raise APIError(404, f"No such File object: {file_id}", code="file_not_found", param="file_id")
    return f


def build_files_router() -> APIRouter:
    router = APIRouter()

    @router.post("/v1/files")
    async def upload(request: Request, file: UploadFile = File(...), purpose: str = Form(...)):
        if purpose not in PURPOSES:
            raise APIError(400, f"purpose must be one of {sorted(PURPOSES)} (got {purpose!r})",
                           code="invalid_value", param="purpose")
        docs = request.app.state.documents
        store = docs.store
        file_id = new_id("file-")
        dest = store.files_dir / file_id
        name = Path(file.filename or "upload").name
        try:
            sha = await run_in_threadpool(_save, file, dest)
            row = store.add_file(name, dest, sha, purpose, uploaded=True, file_id=file_id)
        except BaseException:
            dest.unlink(missing_ok=True)
            raise
        return file_object(row)

    @router.get("/v1/files")
    async def list_files(request: Request, purpose: str | None = None, after: str | None = None,
                         limit: int = Query(10000, ge=1, le=10000), order: str = Query("desc", pattern="^(asc|desc)$")):
        rows = request.app.state.documents.store.files(purpose)
        return listing([file_object(f) for f in rows], after, None, limit, order)

    @router.get("/v1/files/{file_id}")
    async def get_file(file_id: str, request: Request):
        return file_object(file_or_404(request.app.state.documents, file_id))

    @router.get("/v1/files/{file_id}/content")
    async def file_content(file_id: str, request: Request):
        f = file_or_404(request.app.state.documents, file_id)
        if not Path(f.path).is_file():
            raise APIError(404, f"the content of {file_id} ({f.filename}) is gone from disk", code="file_not_found")
        return FileResponse(f.path, filename=f.filename, media_type="application/octet-stream")

    @router.delete("/v1/files/{file_id}")
    async def delete_file(file_id: str, request: Request):
        docs = request.app.state.documents
        file_or_404(docs, file_id)
        for s in docs.store.stores():
            docs.cancel(s.id, file_id)
        await run_in_threadpool(docs.store.delete_file, file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    return router
