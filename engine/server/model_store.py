"""The engine's read-only view of the model store: `<models_dir>/<id>/manifest.json`.

The layout, the id rule and the manifest schema are engine/model_files/manifest.py's, the same
the app writes with. Over HTTP a model is named by its id, never by a path: the id must match the
store's pattern, so it cannot climb out of the models directory, and the file it names is
whatever the manifest (written by the app) says.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from engine.model_files.bundled import DEFAULT_MODEL_ID, DEFAULT_MODEL_NAME, default_model_path
from engine.model_files.load_settings import read_load_settings
from engine.model_files.manifest import MANIFEST, chat_template_path, is_model_id, read_manifest, slugify
from engine.model_files.meta import read_meta
from engine.service.served_model import ModelSpec

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_MODEL_ID", "ModelNotFound", "ModelStore", "spec_from_manifest", "spec_from_path"]


class ModelNotFound(LookupError):
    pass


class ModelStore:
    def __init__(self, root: Path | str | None) -> None:
        self.root = Path(root) if root else None

    def _manifest_path(self, model_id: str) -> Path | None:
        if self.root is None or not is_model_id(model_id):
            return None
        return self.root / model_id / MANIFEST

    def exists(self, model_id: str) -> bool:
        p = self._manifest_path(model_id)
        return (p is not None and p.is_file()) or model_id == DEFAULT_MODEL_ID

    def get(self, model_id: str) -> ModelSpec:
        """The spec of an installed model; the bundled default also works without a store."""
        p = self._manifest_path(model_id)
        if p is not None and p.is_file():
            template = chat_template_path(self.root, model_id)
            spec = spec_from_manifest(read_manifest(p), model_id, str(template) if template else None)
            return replace(spec, load=read_load_settings(self.root, model_id))  # every load honours them
        if model_id == DEFAULT_MODEL_ID:
            return ModelSpec(id=DEFAULT_MODEL_ID, path=str(default_model_path()), format="gguf",
                             name=DEFAULT_MODEL_NAME)
        raise ModelNotFound(f"no installed model has the id {model_id!r}")

    def list(self) -> list[ModelSpec]:
        specs: list[ModelSpec] = []
        if self.root is not None and self.root.is_dir():
            for d in sorted(self.root.iterdir()):
                m = d / MANIFEST
                if is_model_id(d.name) and m.is_file():
                    try:
                        specs.append(spec_from_manifest(read_manifest(m), d.name))
                    except ValueError as e:
                        log.warning("skipping %s: %s", m, e)
        return specs


def spec_from_manifest(m: dict, model_id: str, chat_template: str | None = None) -> ModelSpec:
    ctx, mmproj = m.get("context_length"), m.get("mmproj")
    return ModelSpec(id=model_id, path=m["path"], format=str(m.get("format", "gguf")),
                     name=str(m.get("name") or model_id),
                     context_length=ctx if isinstance(ctx, int) else None, chat_template=chat_template,
                     mmproj=mmproj if isinstance(mmproj, str) and mmproj else None)


def spec_from_path(path: str | Path) -> ModelSpec:
    """`--model PATH` on the command line (never over HTTP); its id is the file's name. A file is
    GGUF, the only file format (a bad one fails its load, reported on /health); a directory is a
    GPTQ, AWQ or compressed-tensors checkpoint whose config is read here (ModelFileError when
    it is not one)."""
    p = Path(path).expanduser().resolve()
    if not p.exists():
        raise ModelNotFound(f"{p} does not exist")
    fmt = read_meta(p).format if p.is_dir() else "gguf"
    return ModelSpec(id=slugify(p.stem), path=str(p), format=fmt, name=p.name)
