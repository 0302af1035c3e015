"""Image bytes as a request sends them (engine/images.py, engine/server/chat_images.py): PNG,
JPEG and WebP decode to the same RGB pixels where the format is lossless, transparency lands on
white, and what cannot be an image is refused in words before its pixels are allocated: bytes
over the size limit, a header that claims more pixels than the limit, bytes Pillow cannot read."""
from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image as PILImage

from engine.images import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, ImageError, decode_image
from engine.server.chat_images import read_image
from engine.server.errors import APIError
from vlm_factory import random_pixels


def _encoded(px: np.ndarray, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    PILImage.fromarray(px).save(buf, format=fmt, **kw)
    return buf.getvalue()


def test_lossless_formats_give_the_same_pixels_and_digest():
    px = random_pixels(7)
    png, webp = decode_image(_encoded(px, "PNG")), decode_image(_encoded(px, "WEBP", lossless=True))
    assert (png.width, png.height) == (px.shape[1], px.shape[0]) and png.rgb == px.tobytes()
    assert webp.digest == png.digest
    jpeg = decode_image(_encoded(px, "JPEG"))
    assert (jpeg.width, jpeg.height) == (png.width, png.height) and jpeg.digest != png.digest


def test_transparency_lands_on_white():
    clear = np.zeros((4, 4, 4), np.uint8)  # fully transparent black
    im = decode_image(_encoded(clear, "PNG"))
    assert set(im.rgb) == {255}


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims width x height pixels and holds none (a decompression bomb's header)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", b"") + _chunk(b"IEND", b"")


def test_what_is_no_usable_image_is_refused_in_words():
    with pytest.raises(ImageError, match="^the image is 9000x9000 pixels; the limit"):
        decode_image(_png_header_only(9000, 9000))
    assert 9000 * 9000 > MAX_IMAGE_PIXELS
    with pytest.raises(ImageError, match="not an image"):
        decode_image(b"GIF89a but not really")
    where = "messages[0].content[1]"
    big = "data:image/png;base64," + base64.b64encode(b"\0" * (MAX_IMAGE_BYTES + 1)).decode()
    with pytest.raises(APIError, match="the limit is 10 MiB") as e:
        read_image(where, big)
    assert e.value.param == where and e.value.status == 400
