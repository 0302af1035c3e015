"""The Responses API's `input_image` parts that name an uploaded file (`file_id`, OpenAI's Files API
on the documents store): the file's bytes become the part's base64 `data:` URI, so every image then
takes the one chat path (engine/server/chat_images.py: decoded, size-checked, tokenized by the
projector). A file that is missing, too large, or a server that keeps no files: a 400 naming the part.
"""
from __future__ import annotations

import base64
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from engine.images import MAX_IMAGE_BYTES
from engine.server.errors import APIError
from engine.server.openai.responses_protocol import InputImagePart, MessageItem, ResponsesRequest


def _file_uri(docs, file_id: str, where: str) -> str:
    def refuse(why: str) -> APIError:
        return APIError(400, f"{where}: {why}", param=where, code="invalid_image")

    try:
        row = docs.store.file(file_id)
    except APIError:  # a server without --docs-dir keeps no files
        raise refuse(f"file_id {file_id!r}: this server keeps no files (start it with --docs-dir); send the "
                     "image as a base64 data: URI") from None
    if row is None or not Path(row.path).is_file():
        raise refuse(f"no uploaded file {file_id!r}")
    size = Path(row.path).stat().st_size
    if size > MAX_IMAGE_BYTES:
        raise refuse(f"file {file_id} is {size / 2**20:.1f} MiB; the limit is {MAX_IMAGE_BYTES >> 20} MiB")
    return "data:application/octet-stream;base64," + base64.b64encode(Path(row.path).read_bytes()).decode()


async def inline_file_images(request, body: ResponsesRequest) -> ResponsesRequest:
    """`body` with each file_id image given its file's bytes as a data: URI (in place)."""
    if isinstance(body.input, str):
        return body
    for k, item in enumerate(body.input):
        if not isinstance(item, MessageItem) or isinstance(item.content, str):
            continue
        for j, part in enumerate(item.content):
            if isinstance(part, InputImagePart) and part.image_url is None and part.file_id:
                part.image_url = await run_in_threadpool(_file_uri, request.app.state.documents, part.file_id,
                                                         f"input[{k}].content[{j}]")
    return body
