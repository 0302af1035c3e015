"""Removing an installed model, one way for `ember models rm` and the model manager's Delete: the
blocks the prefix cache's disk tier keeps for it go first (while a linked file still resolves, and
nothing reads them again), then the model with its projector (`ModelStore.delete`). Files outside
the store (linked on import) stay where they are; the caller says so."""
from __future__ import annotations

from pathlib import Path

from app.store import ModelStore
from engine.kv_disk.folders import forget_model


def remove_model(store: ModelStore, kv_cache_dir: str | Path, model_id: str) -> list[str]:
    """Delete `model_id`'s KV disk blocks, then the model and its projector; returns the files left
    in place (outside the store). KeyError when no such model is installed."""
    m = store.get(model_id)
    if m is None:
        raise KeyError(f"no installed model {model_id!r}")
    forget_model(kv_cache_dir, m.path)
    store.delete(m.id)
    return [p for p in (m.path, m.mmproj) if p and not Path(p).is_relative_to(store.root)]
