"""The parts of a chat message's content (OpenAI's Chat Completions): text, and images by URL.

An image is a base64 `data:` URI (PNG, JPEG, WebP, ... as Pillow reads them); an http(s) URL is
refused, since the engine must not make requests a user did not ask for (engine/server/chat_images.py).
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from engine.images import MAX_IMAGE_BYTES

_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)
MAX_IMAGE_URL_CHARS = 64 + MAX_IMAGE_BYTES * 4 // 3 + 4  # a data: URI of an image at the size limit


class TextPart(BaseModel):
    model_config = _config
    type: Literal["text"]
    text: str


class ImageURL(BaseModel):
    model_config = _config
    url: str = Field(..., max_length=MAX_IMAGE_URL_CHARS)  # a base64 data: URI (an http(s) URL is refused)
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the projector sets the resolution


class ImagePart(BaseModel):
    model_config = _config
    type: Literal["image_url"]
    image_url: ImageURL
    _where: str | None = PrivateAttr(None)  # the part's name in another API's request (Responses' input[k]...)
