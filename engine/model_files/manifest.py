"""The model store's layout and its one manifest schema: `<root>/<model_id>/manifest.json`.

The app writes manifests (app/store.py, and the tests through `write_manifest`); the engine reads
them (engine/server/model_store.py). Both go through here, so the fields, the id rule and the
size cap are written once. A manifest is written to a temp file, fsynced and renamed, so a reader
never sees half of one.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

from engine.model_files.meta import ModelMeta

MANIFEST = "manifest.json"
MODEL_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,127}$"  # a folder name that cannot climb out of the store
MODEL_ID_RE = re.compile(MODEL_ID_PATTERN)
MAX_MANIFEST_BYTES = 1 << 20


@dataclass(frozen=True)
class ModelManifest:
    id: str
    name: str
    path: str  # absolute path of the .gguf file or the GPTQ/AWQ directory
    format: str  # gguf | gptq | awq
    architecture: str
    sha256: str  # of the file; for a directory, of its "relpath\0sha256\n" lines (sorted)
    size_bytes: int
    context_length: int | None
    quantization: str
    parameter_count: int
    source: str  # bundled | import | download
    added_at: str
    url: str | None = None  # where a download came from
    num_layers: int | None = None  # KV-cache shape, for fit advice
    num_kv_heads: int | None = None
    head_dim: int | None = None
    converted_from: str | None = None  # the checkpoint folder this GGUF was converted from on import
    converted_from_sha256: str | None = None  # of the files the conversion read (one conversion per checkpoint)
    mmproj: str | None = None  # a vision model's projector GGUF (absolute path), loaded beside it
    mmproj_sha256: str | None = None  # of the projector file

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelManifest":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def from_meta(cls, model_id: str, path: Path, meta: ModelMeta, *, sha256: str, size_bytes: int,
                  source: str, url: str | None = None, name: str | None = None) -> "ModelManifest":
        """What the store records of a model it has read (metadata from the file, never its name)."""
        return cls(id=model_id, name=name or meta.name or model_id, path=str(path), format=meta.format,
                   architecture=meta.architecture, sha256=sha256, size_bytes=size_bytes,
                   context_length=meta.context_length, quantization=meta.quantization,
                   parameter_count=meta.parameter_count, source=source,
                   added_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), url=url,
                   num_layers=meta.num_layers, num_kv_heads=meta.num_kv_heads, head_dim=meta.head_dim)


def is_model_id(model_id: object) -> bool:
    return isinstance(model_id, str) and MODEL_ID_RE.fullmatch(model_id) is not None


def validate_model_id(model_id: str) -> str:
    if not is_model_id(model_id):
        raise ValueError(f"invalid model id {model_id!r}: use [a-z0-9][a-z0-9._-]{{0,127}}")
    return model_id


def slugify(text: str) -> str:
    """A model id from free text (a file name, a model's own name)."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return slug[:128] or "model"


# A chat template the user chose for an installed model, next to its manifest: it replaces the
# template in the model's file wherever the model loads (GGUF templates are often wrong or missing)
CHAT_TEMPLATE = "chat_template.jinja"


def manifest_path(root: Path, model_id: str) -> Path:
    return Path(root) / validate_model_id(model_id) / MANIFEST


def chat_template_path(root: Path, model_id: str) -> Path | None:
    """The installed model's own chat template file, if the user set one."""
    p = Path(root) / validate_model_id(model_id) / CHAT_TEMPLATE
    return p if p.is_file() else None


def read_manifest(path: Path) -> dict:
    """The manifest's JSON object; ValueError when it is too large, unreadable or has no path.
    Readers take the fields they need (the engine: path, format, name, context length)."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise ValueError(f"{path} is too large to be a manifest")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a readable manifest: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("path"), str):
        raise ValueError(f"{path} has no model path")
    return data


def write_manifest(root: Path, manifest: ModelManifest) -> Path:
    """Write `<root>/<id>/manifest.json` atomically; only once the model's file is in place."""
    path = manifest_path(root, manifest.id)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, manifest.to_dict())
    return path


def write_json_atomic(path: Path, data) -> None:
    write_text_atomic(path, json.dumps(data, indent=2))


def write_text_atomic(path: Path, text: str) -> None:
    """`path` holds the old text or the new, never a part of either (write, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # not supported (Windows)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
