"""Install a model behind an engine's back, as the store would: the one manifest writer.

Engines for the tests come from app/engine_process.py (see server_util.start_engine).
"""
from __future__ import annotations

from pathlib import Path

from engine.model_files.manifest import ModelManifest, write_manifest as write_store_manifest
from engine.model_files.meta import read_meta


def write_manifest(models_dir: Path, model_id: str, path: Path) -> None:
    """Register a model file in the store layout the engine reads (what app/store.py writes),
    its metadata read from the file; no hashing (these files are throwaway)."""
    meta = read_meta(path)
    write_store_manifest(models_dir, ModelManifest.from_meta(model_id, path, meta, sha256="", name=model_id,
                                                             size_bytes=path.stat().st_size, source="import"))
