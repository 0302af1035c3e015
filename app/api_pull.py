"""The app's downloads behind Ollama's /api/pull (engine/server/ollama/pull.py says why the app
hands them over): a name resolved to a catalog entry or a hub file, downloaded by the same
DownloadManager as `ember models pull` and the model manager (resumable, sha256-checked, the
same queue file and per-model locks), and its events told as Ollama's progress lines.

Names, as Ollama's clients send them:
- a catalog id, with or without `:latest` (`qwen3-0.6b-q4_k_m`);
- Ollama's `family:size` (`qwen3:0.6b`): the catalog ids that start with `family-size-`, the
  Q4_K_M one where there are several (Ollama's default quantization);
- `hf.co/OWNER/REPO[:QUANT]` (also `huggingface.co/…`): a GGUF file of a hub repository, by
  quantization, Q4_K_M where none is named, as Ollama pulls from the hub.
"""
from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Iterator

from app.catalog import Catalog, CatalogEntry
from app.download_jobs import JobState
from app.hub import HubError, gguf_entries
from app.store import ModelStore
from engine.server.ollama.pull import PullError, PullProgress

HUB_PREFIXES = ("hf.co/", "huggingface.co/")
DEFAULT_QUANT = "Q4_K_M"


def _pick_quant(entries: list[CatalogEntry], quant: str | None, name: str) -> CatalogEntry:
    want = (quant or DEFAULT_QUANT).upper()
    hits = [e for e in entries if e.quantization.upper() == want]
    if hits:
        return hits[0]
    if quant is None and len(entries) == 1:
        return entries[0]
    have = ", ".join(sorted({e.quantization for e in entries})) or "none"
    raise PullError(404, f"{name}: no {want} GGUF file (it has: {have})")


def resolve(name: str, catalog: Catalog, hub_base_url: str) -> CatalogEntry:
    """The entry a pull of `name` downloads; PullError (404) naming the problem otherwise."""
    name = name.strip()
    for prefix in HUB_PREFIXES:
        if name.lower().startswith(prefix):
            repo, _, quant = name[len(prefix):].partition(":")
            if repo.count("/") != 1:
                raise PullError(400, f"{name}: a hub model is hf.co/OWNER/REPO[:QUANT]")
            try:
                entries = gguf_entries(hub_base_url, repo)
            except HubError as e:
                raise PullError(404, f"{name}: {e}") from None
            return _pick_quant(entries, quant if quant and quant != "latest" else None, name)
    base, _, tag = name.lower().partition(":")
    key = base if tag in ("", "latest") else f"{base}-{tag}"
    if (entry := catalog.get(key)) is not None:
        return entry
    family = [e for e in catalog if e.id.startswith(key + "-")]
    if family:
        return next((e for e in family if e.quantization.upper() == DEFAULT_QUANT), family[0])
    raise PullError(404, f"model {name!r} is not in Ember's catalog (see `ember models search`); a hub "
                         "GGUF is pulled as hf.co/OWNER/REPO:QUANT")


class StorePuller:
    """`Puller` over a DownloadManager; it starts no queued job of another process (autostart off)."""

    def __init__(self, store: ModelStore, downloads, catalog: Catalog, hub_base_url: str) -> None:
        self.store, self.downloads, self.catalog, self.hub_base_url = store, downloads, catalog, hub_base_url

    @classmethod
    def from_settings(cls, models_dir: str | Path | None) -> "StorePuller":
        """The user's store (the engine's --models-dir where given), queue, catalog and hub."""
        from app.downloads import DownloadManager
        from app.settings import Settings

        settings = Settings.load()
        store = ModelStore(Path(models_dir) if models_dir else settings.models_dir)
        downloads = DownloadManager(store, settings.data_dir / "downloads", settings.hub_base_url,
                                    settings.max_parallel_downloads, autostart=False)
        return cls(store, downloads, Catalog.load(hub_base_url=settings.hub_base_url), settings.hub_base_url)

    def start(self, name: str) -> Iterator[PullProgress]:
        entry = resolve(name, self.catalog, self.hub_base_url)
        if self.store.get(entry.id) is not None:
            return iter([PullProgress("pulling manifest"), PullProgress("success")])
        events: queue.Queue = queue.Queue()
        unsubscribe = self.downloads.subscribe(lambda e: events.put(e) if e.model_id == entry.id else None)
        try:
            self.downloads.start(entry)
        except (ValueError, OSError) as e:
            unsubscribe()
            raise PullError(500, f"{name}: {e}") from None
        return self._progress(entry, events, unsubscribe)

    def _progress(self, entry: CatalogEntry, events: queue.Queue, unsubscribe) -> Iterator[PullProgress]:
        sha = entry.sha256
        layer = f"pulling {sha[:12]}" if sha else f"pulling {entry.file.rsplit('/', 1)[-1]}"
        digest = f"sha256:{sha}" if sha else None
        try:
            yield PullProgress("pulling manifest")
            while True:
                e = events.get()
                if e.state in (JobState.QUEUED, JobState.RUNNING):
                    yield PullProgress(layer, digest, e.bytes_total, e.bytes_done)
                elif e.state is JobState.VERIFYING:
                    yield PullProgress(layer, digest, e.bytes_total, e.bytes_total or e.bytes_done)
                    yield PullProgress("verifying sha256 digest")
                elif e.state is JobState.DONE:
                    yield PullProgress("writing manifest")
                    yield PullProgress("success")
                    return
                else:  # failed, paused or cancelled by another hand (the model manager, the CLI)
                    raise PullError(500, f"{entry.id}: {e.error or 'the download was ' + e.state.value}")
        finally:
            unsubscribe()


class SettingsPuller:
    """A StorePuller built from the user's settings on the first pull: an engine that never pulls
    never reads them (nor creates them, as a first Settings.load does)."""

    def __init__(self, models_dir: str | Path | None) -> None:
        self.models_dir, self._puller, self._lock = models_dir, None, threading.Lock()

    def start(self, name: str) -> Iterator[PullProgress]:
        with self._lock:
            if self._puller is None:
                self._puller = StorePuller.from_settings(self.models_dir)
        return self._puller.start(name)
