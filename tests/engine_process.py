"""The model store's manifest, written by hand for the tests that install models behind an engine's back.

Engines for the tests come from app/engine_process.py (see server_util.start_engine).
"""
from __future__ import annotations

import json
import time
from pathlib import Path


def write_manifest(models_dir: Path, model_id: str, path: Path) -> None:
    """Register a model file in the store layout the engine reads (what app/store.py writes)."""
    d = models_dir / model_id
    d.mkdir(parents=True, exist_ok=True)
    (d / "manifest.json").write_text(json.dumps({
        "id": model_id, "name": model_id, "path": str(path), "format": "gguf", "architecture": "llama",
        "sha256": "", "size_bytes": path.stat().st_size, "context_length": 512, "quantization": "F32",
        "parameter_count": 0, "source": "import", "added_at": time.time()}))
