"""The images of the chats: files in the history's folder (`images/<sha256>.<ext>`), named by the hash
of their bytes, so the same picture sent twice (or in two chats) is one file and a message's record
of it is the hash and type alone. A message sends them again on each later turn as OpenAI `image_url`
parts with base64 `data:` URIs, the way the engine reads a chat's images.

Qt-free: the window's attach, paste and drop (ui/chat_images.py) hand over bytes; the chat store
keeps the references (app/history.py, the `images` column) and the Markdown export copies the files."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

# The types the engine decodes (Pillow: PNG, JPEG, WebP), by file suffix and by their first bytes.
MIME_BY_SUFFIX = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}
SUFFIX_BY_MIME = {"image/png": ".png", "image/jpeg": ".jpg", "image/webp": ".webp"}
MAX_IMAGE_BYTES = 10 << 20  # the engine refuses more (engine/images.py)


class ImageError(ValueError):
    """Bytes that are not a PNG, JPEG or WebP image, or too many of them; says which, in words."""


@dataclass(frozen=True, slots=True)
class ImageRef:
    """One image of a message: its file is `<folder>/<sha256><suffix>` in the chat store's image folder."""
    sha256: str
    mime: str
    name: str = ""  # the file it came from, when it had one (shown, never used to find it)

    @property
    def file_name(self) -> str:
        return self.sha256 + SUFFIX_BY_MIME.get(self.mime, ".img")


def sniff_mime(data: bytes) -> str | None:
    """The image type from the first bytes (what a pasted image or a misnamed file really is)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def is_image_path(path: Path) -> bool:
    return path.suffix.lower() in MIME_BY_SUFFIX


class ImageFolder:
    """The folder of images beside the history file; writing is atomic (a temp file renamed)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def add(self, data: bytes, name: str = "") -> ImageRef:
        """Keep `data` (once per content) and return its reference; ImageError when it is no image."""
        mime = sniff_mime(data)
        if mime is None:
            raise ImageError(f"{name or 'the image'}: not a PNG, JPEG or WebP image")
        if len(data) > MAX_IMAGE_BYTES:
            raise ImageError(f"{name or 'the image'}: {len(data) >> 20} MiB, over the "
                             f"{MAX_IMAGE_BYTES >> 20} MiB an image may have")
        ref = ImageRef(hashlib.sha256(data).hexdigest(), mime, name)
        path = self.path(ref)
        if not path.is_file():
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return ref

    def add_file(self, path: Path) -> ImageRef:
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise ImageError(f"{Path(path).name}: {e.strerror or e}") from None
        return self.add(data, Path(path).name)

    def path(self, ref: ImageRef) -> Path:
        return self.folder / ref.file_name

    def read(self, ref: ImageRef) -> bytes | None:
        """The image's bytes, or None when its file is gone (deleted by hand, a chat imported without it)."""
        try:
            return self.path(ref).read_bytes()
        except OSError:
            return None

    def data_uri(self, ref: ImageRef) -> str | None:
        data = self.read(ref)
        return None if data is None else f"data:{ref.mime};base64," + base64.b64encode(data).decode("ascii")

    def sweep(self, keep: set[str], only: set[str] | None = None) -> int:
        """Delete the images whose hash is not in `keep` (no message holds them now), of those in
        `only` when given (a deleted message's); returns how many."""
        gone = 0
        for path in self.folder.glob("*.*") if self.folder.is_dir() else ():
            if _is_sha256(path.stem) and path.stem not in keep and (only is None or path.stem in only):
                path.unlink(missing_ok=True)
                gone += 1
        return gone

    def copy_beside(self, refs: list[ImageRef], markdown_path: Path) -> str:
        """Copy `refs` into `<stem>_images/` next to an exported Markdown file; return that folder's name
        (the relative prefix its links use). Files already gone are skipped."""
        target = Path(markdown_path).with_name(Path(markdown_path).stem + "_images")
        for ref in refs:
            if self.path(ref).is_file():
                target.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.path(ref), target / ref.file_name)
        return target.name


def images_json(refs: list[ImageRef] | None) -> str | None:
    if not refs:
        return None
    return json.dumps([{"sha256": r.sha256, "mime": r.mime, "name": r.name} for r in refs], ensure_ascii=False)


def images_from_json(value: object) -> list[ImageRef]:
    """From the column's JSON text (or an export's list); a malformed entry is left out."""
    try:
        items = json.loads(value) if isinstance(value, str) else (value or [])
        return [ImageRef(str(d["sha256"]), str(d["mime"]), str(d.get("name") or "")) for d in items
                if isinstance(d, dict) and _is_sha256(d.get("sha256"))]
    except (ValueError, TypeError, KeyError):
        return []


def _is_sha256(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def image_parts(text: str, uris: list[str]) -> list[dict]:
    """A user message's content with its images: the text, then each image as an `image_url` part."""
    parts = [{"type": "text", "text": text}] if text else []
    return parts + [{"type": "image_url", "image_url": {"url": uri}} for uri in uris]
