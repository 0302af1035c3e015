"""Installed models: one folder per model id under a root, each with a manifest.json.

The layout, the ids and the manifest schema are engine/model_files/manifest.py's (the engine reads
the same files). A folder without a manifest is not a model (a download in progress keeps its
`.part` files there), and a manifest is written only after its file is in place. A file or
directory whose metadata does not read (engine/model_files/meta.py) is refused before any copy.
"""
from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

from app.store_convert import converts, import_converted
from app.store_files import path_size, place_checked, sha256_file, sha256_path
from app.store_vision import with_projector
from engine.model_files.bundled import DEFAULT_MODEL_ID, DEFAULT_MODEL_NAME, default_model_path
from engine.model_files.load_settings import LoadSettings, load_settings_path, read_load_settings
from engine.model_files.manifest import (CHAT_TEMPLATE, MANIFEST, ModelManifest, chat_template_path, fsync_dir,
                                         is_model_id, read_manifest, slugify, validate_model_id, write_json_atomic,
                                         write_manifest, write_text_atomic)
from engine.model_files.meta import ModelFileError, ModelMeta, read_meta
from engine.model_files.fit import check_runnable
from engine.model_files.projector import check_projector

log = logging.getLogger(__name__)

IMPORT_MODES = ("copy", "move", "link")
_DEFAULT_REMOVED = ".default_removed"  # the user deleted the bundled model: don't re-add it

__all__ = ["DEFAULT_MODEL_ID", "IMPORT_MODES", "LoadSettings", "MANIFEST", "ModelFileError", "ModelManifest",
           "ModelStore", "fsync_dir", "path_size", "sha256_file", "sha256_path", "validate_model_id", "write_json_atomic"]


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
        if not is_model_id(model_id):
            return None
        p = self.root / model_id / MANIFEST
        return self._read_manifest(p) if p.is_file() else None

    def _read_manifest(self, p: Path) -> ModelManifest | None:
        try:
            return ModelManifest.from_dict(read_manifest(p))
        except (ValueError, TypeError) as e:
            log.warning("ignoring unreadable manifest %s: %s", p, e)
            return None

    # --- adding ----------------------------------------------------------------------------
    def register(self, path: Path, *, model_id: str, source: str, url: str | None = None,
                 sha256: str | None = None, name: str | None = None,
                 mmproj: Path | None = None, mmproj_sha256: str | None = None) -> ModelManifest:
        """Register a model whose file already sits where it will stay (download, bundled, link),
        with its projector `mmproj` where it already sits too.

        Reads the metadata from the files first; a broken file raises ModelFileError and nothing
        is registered. The sha256s are computed when not given.
        """
        path = Path(path).resolve()
        meta = read_meta(path)
        check_runnable(meta, path)
        proj = check_projector(Path(mmproj).resolve(), path) if mmproj else None
        digest = sha256 or sha256_path(path)
        with self._lock:
            manifest = ModelManifest.from_meta(validate_model_id(model_id), path, meta, sha256=digest,
                                               size_bytes=path_size(path), source=source, url=url, name=name)
            if proj is not None:
                manifest = with_projector(manifest, proj.parent, proj, "link", sha256=mmproj_sha256)
            write_manifest(self.root, manifest)
        log.info("registered %s (%s, %s)", model_id, meta.architecture, meta.quantization)
        return manifest

    def import_path(self, path: Path, *, model_id: str | None = None, mode: str | None = None,
                    outtype: str = "f16", mmproj: Path | None = None) -> ModelManifest:
        """Import a GGUF file or a GPTQ/AWQ/compressed-tensors directory: copy (default), move,
        or link (register in place); `mmproj`, a vision model's projector, goes with it the same
        way and is paired in the manifest. Importing bytes already installed returns the existing
        model (paired with `mmproj` when given) instead of a duplicate. A BERT embedder's folder is
        converted to a GGUF of `outtype` instead (app/store_convert.py).
        """
        mode = mode or self.import_mode
        if mode not in IMPORT_MODES:
            raise ValueError(f"mode must be one of {IMPORT_MODES}")
        src = Path(path).expanduser().resolve()
        if converts(src):
            if mmproj:
                raise ModelFileError(f"--mmproj {mmproj}: a projector goes with a GGUF vision model, not {src}")
            return import_converted(self, src, model_id=model_id, outtype=outtype)
        meta = read_meta(src)  # validates before anything is copied
        check_runnable(meta, src)
        proj = check_projector(Path(mmproj).expanduser().resolve(), src) if mmproj else None
        digest = sha256_path(src)
        for m in self.list():
            if m.sha256 == digest and Path(m.path).exists():
                log.info("%s is already installed as %s", src, m.id)
                return self.pair(m.id, proj, mode=mode) if proj else m
        with self._lock:
            model_id = validate_model_id(model_id) if model_id else self._free_id(self._suggest_id(meta, src))
            d = self.model_dir(model_id)
            if (d / MANIFEST).exists():
                raise FileExistsError(f"a model with id {model_id!r} is already installed")
            created = not d.exists()
            d.mkdir(parents=True, exist_ok=True)
            try:
                dest = src if mode == "link" else place_checked(src, d / src.name, digest, move=(mode == "move"))
                manifest = ModelManifest.from_meta(model_id, dest, meta, sha256=digest,
                                                   size_bytes=path_size(dest), source="import")
                if proj is not None:
                    manifest = with_projector(manifest, d, proj, mode)
                write_manifest(self.root, manifest)
            except BaseException:
                if created:
                    shutil.rmtree(d, ignore_errors=True)
                raise
        return manifest

    def pair(self, model_id: str, mmproj: Path, *, mode: str | None = None) -> ModelManifest:
        """Give an installed model its projector (copied, moved or linked as `mode` says), replacing
        the one it had; ModelFileError when the file is no projector of this model."""
        with self._lock:
            m = self.get(model_id)
            if m is None:
                raise KeyError(f"no installed model {model_id!r}")
            proj = check_projector(Path(mmproj).expanduser().resolve(), m.path)
            paired = with_projector(m, self.model_dir(model_id), proj, mode or self.import_mode)
            write_manifest(self.root, paired)
            old = Path(m.mmproj) if m.mmproj else None
            if old is not None and old != Path(paired.mmproj) and old.is_relative_to(self.model_dir(model_id)):
                old.unlink(missing_ok=True)
            return paired

    def ensure_default(self) -> ModelManifest | None:
        """Register the bundled model in place (no copy) on first run; None when not installed."""
        with self._lock:
            try:
                path = default_model_path().resolve()
            except FileNotFoundError as e:
                log.warning("bundled model unavailable: %s", e)
                return None
            current = self.get(DEFAULT_MODEL_ID)
            if current is not None and Path(current.path) == path and path.is_file():
                return current
            if current is None and (self.root / _DEFAULT_REMOVED).exists():
                return None
            return self.register(path, model_id=DEFAULT_MODEL_ID, source="bundled", name=DEFAULT_MODEL_NAME)

    # --- a model's chat template -------------------------------------------------------------
    def chat_template(self, model_id: str) -> str | None:
        """The template the user set for this model (None: the file's own is used)."""
        p = chat_template_path(self.root, model_id)
        return p.read_text(encoding="utf-8") if p else None

    def set_chat_template(self, model_id: str, source: str | None) -> None:
        """Replace the model's chat template wherever it loads (None: back to the file's own).
        A template that does not compile is refused (ValueError naming the line), nothing written."""
        with self._lock:
            if self.get(model_id) is None:
                raise KeyError(f"no installed model {model_id!r}")
            target = self.model_dir(model_id) / CHAT_TEMPLATE
            if source is None:
                target.unlink(missing_ok=True)
                return
            if not source.strip():
                raise ValueError("the chat template is empty")
            from jinja2 import TemplateSyntaxError
            from jinja2.sandbox import ImmutableSandboxedEnvironment
            try:
                ImmutableSandboxedEnvironment().parse(source)
            except TemplateSyntaxError as e:
                raise ValueError(f"the chat template does not compile: line {e.lineno}: {e.message}") from None
            write_text_atomic(target, source)

    # --- a model's load settings (context, device, threads) ----------------------------------
    def load_settings(self, model_id: str) -> LoadSettings:
        """What the user set for this model's loads (the defaults when nothing is set)."""
        return read_load_settings(self.root, model_id)

    def set_load_settings(self, model_id: str, settings: LoadSettings) -> None:
        """Every later load of the model uses these (the defaults remove the file)."""
        with self._lock:
            if self.get(model_id) is None:
                raise KeyError(f"no installed model {model_id!r}")
            target = load_settings_path(self.root, model_id)
            if settings.is_default:
                target.unlink(missing_ok=True)
            else:
                write_json_atomic(target, settings.to_dict())

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
        """True when the model's bytes (and its projector's) still hash to the manifest's sha256."""
        m = self.get(model_id)
        if m is None:
            raise KeyError(f"no installed model {model_id!r}")
        p, proj = Path(m.path), Path(m.mmproj) if m.mmproj else None
        if not p.exists() or (proj is not None and not proj.is_file()):
            return False
        return sha256_path(p) == m.sha256 and (proj is None or m.mmproj_sha256 in (None, sha256_file(proj)))

    # --- helpers ---------------------------------------------------------------------------
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
