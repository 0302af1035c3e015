"""The images of a chat request, made ready for the model: OpenAI's `image_url` parts decoded and
tokenized with the prompt by the model's projector (engine/backends/llamacpp_vision.py).

The rendered prompt holds the media marker where each image was sent (ChatMessage.text); mtmd
turns it into the model's image tokens. Every refusal is a 400 naming the part,
`messages[i].content[j]`: a model loaded without a projector, an http(s) URL unless the server
allows fetching (engine/server/image_fetch.py; the engine makes no request a user did not ask for)
or one that could not be fetched, a URI that is not base64, an image over the size limit, bytes
that are no image Pillow reads.
"""
from __future__ import annotations

import base64
import binascii
import re

from starlette.concurrency import run_in_threadpool

from engine.images import MAX_IMAGE_BYTES, Image, ImageError, decode_image
from engine.server.errors import APIError
from engine.server.image_fetch import SETTING, FetchError, fetch_image
from engine.server.openai.protocol import ChatCompletionRequest
from engine.server.serving import encode

_DATA_URI = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+=-]+)*),(?P<data>.*)", re.S)


def image_parts(body: ChatCompletionRequest) -> list[tuple[str, str]]:
    """(where, url) of every image part of the messages, in order."""
    return [(p._where or f"messages[{i}].content[{j}]", p.image_url.url)
            for i, m in enumerate(body.messages) for j, p in m.image_parts]


def read_image(where: str, url: str, fetch: bool = False) -> Image:
    """The image of one part (an http(s) URL fetched when `fetch`), or the 400 that names it."""
    def refuse(why: str, code: str = "invalid_image") -> APIError:
        return APIError(400, f"{where}: {why}", param=where, code=code)

    if url[:8].lower().startswith(("http://", "https://")):
        if not fetch:
            raise refuse(f"an http(s) image URL is not fetched unless the server allows it (the setting {SETTING}, "
                         "`ember serve --fetch-image-urls`; the engine makes no request you did not ask for): "
                         "send the image as a base64 data: URI", "invalid_image_url")
        try:
            return _decoded(fetch_image(url), refuse)
        except FetchError as e:
            raise refuse(str(e), "invalid_image_url") from None
    m = _DATA_URI.fullmatch(url)
    if m is None or ";base64" not in m["params"]:
        raise refuse("not a base64 data: URI (data:image/png;base64,...)", "invalid_image_url")
    try:
        data = base64.b64decode(m["data"], validate=True)
    except (binascii.Error, ValueError):
        raise refuse("the data: URI's base64 does not decode") from None
    return _decoded(data, refuse)


def _decoded(data: bytes, refuse) -> Image:
    if len(data) > MAX_IMAGE_BYTES:
        raise refuse(f"the image is {len(data) / 2**20:.1f} MiB; the limit is {MAX_IMAGE_BYTES >> 20} MiB")
    try:
        return decode_image(data)
    except ImageError as e:
        raise refuse(str(e)) from None


async def encode_chat(engine, body: ChatCompletionRequest, prompt: str,
                      fetch: bool = False) -> tuple[list[int], list]:
    """The prompt's token ids and its image spans (none for a chat without images); `fetch`: the
    server allows fetching http(s) image URLs."""
    parts = image_parts(body)
    if not parts:
        return await encode(engine, prompt), []
    vision = engine.runner.vision
    if vision is None:
        where = parts[0][0]
        raise APIError(400, f"{where}: this model cannot see images (it was loaded without its projector, "
                            "--mmproj)", param=where, code="image_not_supported")
    images = [await run_in_threadpool(read_image, where, url, fetch) for where, url in parts]
    try:
        return await run_in_threadpool(vision.tokenize, prompt, images)
    except ValueError as e:
        raise APIError(400, f"the images could not be placed in the prompt: {e}", param="messages") from None
