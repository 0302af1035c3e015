"""The engine's read-only view of the model store: `<models_dir>/<id>/manifest.json`.

The app writes the store (app/store.py); the engine only reads manifests, without importing
app. Over HTTP a model is named by its id, never by a path: the id must match the store's
pattern, so it cannot climb out of the models directory, and the file it names is whatever
the manifest (written by the app) says.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from engine.loaders.default_model import default_model_path
from engine.server.engine_thread import ModelSpec

log = logging.getLogger(__name__)

MODEL_ID_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
DEFAULT_MODEL_ID = "smollm2-135m-instruct-q4_1"
MAX_MANIFEST_BYTES = 1 << 20


class ModelNotFound(LookupError):
    pass


class ModelStore:
    def __init__(self, root: Path | str | None) -> None:
        self.root = Path(root) if root else None

    def _manifest_path(self, model_id: str) -> Path | None:
        if self.root is None or not MODEL_ID_RE.fullmatch(model_id or ""):
            return None
        return self.root / model_id / "manifest.json"

    def exists(self, model_id: str) -> bool:
        p = self._manifest_path(model_id)
        return (p is not None and p.is_file()) or model_id == DEFAULT_MODEL_ID

    def get(self, model_id: str) -> ModelSpec:
        """The spec of an installed model; the bundled default also works without a store."""
        p = self._manifest_path(model_id)
        if p is not None and p.is_file():
            return spec_from_manifest(read_manifest(p), model_id)
        if model_id == DEFAULT_MODEL_ID:
            return ModelSpec(id=DEFAULT_MODEL_ID, path=str(default_model_path()), format="gguf",
                             name="SmolLM2 135M Instruct (Q4_1)")
        raise ModelNotFound(f"no installed model has the id {model_id!r}")

    def list(self) -> list[ModelSpec]:
        specs: list[ModelSpec] = []
        if self.root is not None and self.root.is_dir():
            for d in sorted(self.root.iterdir()):
                m = d / "manifest.json"
                if MODEL_ID_RE.fullmatch(d.name) and m.is_file():
                    try:
                        specs.append(spec_from_manifest(read_manifest(m), d.name))
                    except ValueError as e:
                        log.warning("skipping %s: %s", m, e)
        return specs


def read_manifest(path: Path) -> dict:
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise ValueError(f"{path} is too large to be a manifest")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a readable manifest: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("path"), str):
        raise ValueError(f"{path} has no model path")
    return data


def spec_from_manifest(m: dict, model_id: str) -> ModelSpec:
    ctx = m.get("context_length")
    return ModelSpec(id=model_id, path=m["path"], format=str(m.get("format", "gguf")),
                     name=str(m.get("name") or model_id),
                     context_length=ctx if isinstance(ctx, int) else None)


def spec_from_path(path: str | Path) -> ModelSpec:
    """`--model PATH` on the command line (never over HTTP): its id is the file's name."""
    p = Path(path).expanduser().resolve()
    if not p.exists():
        raise ModelNotFound(f"{p} does not exist")
    slug = re.sub(r"[^a-z0-9._-]+", "-", p.stem.lower()).strip("-._")[:128] or "model"
    fmt = "gguf" if p.suffix.lower() == ".gguf" else "gptq"
    if p.is_dir() and (p / "quant_config.json").is_file():
        fmt = "awq"
    return ModelSpec(id=slug, path=str(p), format=fmt, name=p.name)
