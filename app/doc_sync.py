"""A collection's files against the disk, and indexing progress in words. Qt-free: the Documents
view runs these on workers.

Each file the window adds keeps where it came from in its vector-store file's attributes,
{"path": ..., "sha256": ...}, so `sync` can find what changed since (uploaded again, the old copy
removed) and what is gone from the disk (removed from the collection).
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from app.client import EngineClient, EngineClientError
from app.store import sha256_file

CHAT_KEY = "ember_chat"  # a chat's own collection carries its chat id in its metadata


def file_attributes(path: Path) -> dict[str, str]:
    path = Path(path).resolve()
    return {"path": str(path), "sha256": sha256_file(path)}


def add_file(client: EngineClient, store_id: str, path: Path) -> dict:
    """Upload one file and attach it to the store (indexed in the background): its vector-store file."""
    attributes = file_attributes(path)
    uploaded = client.upload_file(path)
    attached = client.attach_file(store_id, uploaded["id"], attributes)
    return {**attached, "filename": uploaded.get("filename", Path(path).name)}


def add_files(client: EngineClient, store_id: str, paths: list[Path]) -> Iterator[tuple[str, str]]:
    """Each file in turn: yields (path, "" when added, else the reason in words)."""
    for path in paths:
        try:
            add_file(client, store_id, Path(path))
            yield str(path), ""
        except (OSError, EngineClientError) as e:
            yield str(path), getattr(e, "message", None) or getattr(e, "strerror", None) or str(e)


def named_files(client: EngineClient, store_id: str) -> list[dict]:
    """The store's files, each with its `filename` (a vector-store file object has none: files added
    by the CLI or another program are named from the Files API)."""
    files = client.vector_store_files(store_id)
    if any(not (f.get("attributes") or {}).get("path") for f in files):
        names = {f["id"]: f.get("filename") for f in client.files()}
        files = [{**f, "filename": names.get(f["id"])} for f in files]
    return files


def remove_file(client: EngineClient, store_id: str, file_id: str) -> None:
    """Out of the collection, and the upload deleted too (a file the window added is its own)."""
    client.detach_file(store_id, file_id)
    try:
        client.delete_file(file_id)
    except EngineClientError as e:
        if e.status_code != 404:
            raise


def delete_collection(client: EngineClient, store_id: str) -> None:
    """The collection, and the uploads of its files with it."""
    files = client.vector_store_files(store_id)
    client.delete_vector_store(store_id)
    for f in files:
        try:
            client.delete_file(f["id"])
        except EngineClientError as e:
            if e.status_code != 404:
                raise


@dataclass(frozen=True, slots=True)
class SyncPlan:
    changed: list[tuple[str, Path]]  # (file id, local path): the content differs from what was indexed
    gone: list[str]  # file ids whose local file no longer exists


def plan_sync(files: list[dict]) -> SyncPlan:
    """Compare each file the window added (attributes path + sha256) with the disk."""
    changed, gone = [], []
    for f in files:
        attrs = f.get("attributes") or {}
        if not attrs.get("path"):
            continue  # added by another program: nothing to compare with
        path = Path(str(attrs["path"]))
        if not path.is_file():
            gone.append(f["id"])
        elif sha256_file(path) != attrs.get("sha256"):
            changed.append((f["id"], path))
    return SyncPlan(changed, gone)


def sync(client: EngineClient, store_id: str) -> dict:
    """Re-upload the changed files, remove the gone ones: {"changed": n, "removed": n}."""
    plan = plan_sync(client.vector_store_files(store_id))
    for file_id, path in plan.changed:
        add_file(client, store_id, path)
        remove_file(client, store_id, file_id)
    for file_id in plan.gone:
        remove_file(client, store_id, file_id)
    return {"changed": len(plan.changed), "removed": len(plan.gone)}


class IndexClock:
    """The time left for each file indexing, from the rate measured since it was first seen."""

    def __init__(self) -> None:
        self._first: dict[str, tuple[float, int]] = {}  # file id -> (when, chunks done then)

    def seconds_left(self, file_id: str, done: int, total: int, now: float | None = None) -> float | None:
        now = time.monotonic() if now is None else now
        t0, done0 = self._first.setdefault(file_id, (now, done))
        if done <= done0 or now <= t0 or total <= done:
            return None
        return (total - done) / ((done - done0) / (now - t0))


def status_words(f: dict, seconds_left: float | None = None) -> str:
    """A vector-store file's state for a person: indexing (n of m, time left), indexed (chunks), failed (why)."""
    status = f.get("status")
    if status == "in_progress":
        progress = f.get("progress") or {}
        done, total = progress.get("chunks_done"), progress.get("chunks_total")
        if not total:
            return "Waiting to be indexed"  # behind other files, or being read
        words = f"Indexing: {done} of {total} passages"
        return words + (f", {duration_words(seconds_left)} left" if seconds_left is not None else "")
    if status == "completed":
        chunks = f.get("chunks", (f.get("progress") or {}).get("chunks_total"))
        if chunks is not None:
            return f"Indexed: {chunks} passage{'s' if chunks != 1 else ''}"
        return f"Indexed ({size_words(f['usage_bytes'])})" if f.get("usage_bytes") else "Indexed"
    if status == "failed":
        return "Failed: " + ((f.get("last_error") or {}).get("message") or "the file could not be indexed")
    return "Cancelled" if status == "cancelled" else str(status or "")


def size_words(n: int) -> str:
    for unit in ("bytes", "KB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def duration_words(seconds: float) -> str:
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    if seconds < 3600:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
