"""An image a request carries: RGB pixels, decoded once from the bytes a client sent. No torch.

PNG, JPEG and WebP (and whatever else Pillow reads) are decoded here, flattened to 8-bit RGB
(transparency over white, as a chat window shows it); the runner's projector resizes them to
the model's own size. `digest` names the pixels, not the file: the same picture sent as PNG and
as lossless WebP is the same image to the prefix cache.
"""
from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass, field

MAX_IMAGE_PIXELS = 50_000_000  # a decompression bomb is refused before its pixels are allocated
MAX_IMAGE_BYTES = 10 * 2**20  # an image file larger than this is refused (the request body itself is at most 16 MiB)
MEDIA_MARKER = "<__media__>"  # where an image stands in a rendered prompt (libmtmd's default marker)


class ImageError(ValueError):
    """Bytes that are not an image Ember can read; the message says why."""


@dataclass(frozen=True)
class Image:
    width: int
    height: int
    rgb: bytes = field(repr=False)  # height * width * 3 bytes, rows top to bottom

    @property
    def digest(self) -> str:
        return hashlib.sha256(f"{self.width}x{self.height}:".encode() + self.rgb).hexdigest()


def decode_image(data: bytes) -> Image:
    """Pillow's reading of `data` as RGB; ImageError when it is no image it reads."""
    from PIL import Image as PILImage

    PILImage.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
    try:
        with warnings.catch_warnings():  # Pillow warns of a large image; it is refused below, in words
            warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)
            im = PILImage.open(io.BytesIO(data))  # reads the header only
        with im:
            if im.width * im.height > MAX_IMAGE_PIXELS:
                raise ImageError(f"the image is {im.width}x{im.height} pixels; the limit is {MAX_IMAGE_PIXELS:,}")
            im.load()
            if im.mode in ("RGBA", "LA", "P"):
                im = im.convert("RGBA")
                back = PILImage.new("RGBA", im.size, (255, 255, 255, 255))
                im = PILImage.alpha_composite(back, im)
            rgb = im.convert("RGB")
            return Image(rgb.width, rgb.height, rgb.tobytes())
    except ImageError:
        raise
    except (PILImage.DecompressionBombError, OSError, ValueError, SyntaxError) as e:
        raise ImageError(f"not an image Ember can read ({e})") from None
