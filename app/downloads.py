"""Downloads of catalog models: resumable, retried, verified, and never registered half-done.

Each job downloads its file(s) into `<models root>/<model id>/…/<file>.part` (see
download_fetch), then checks sha256 (the catalog's, else the hub's X-Linked-Etag/ETag, else
records what it computed), renames each `.part` atomically, and only then writes the store
manifest. The queue is persisted as JSON under `state_dir`, and `.part` files are kept, so a
restarted process resumes where the last one stopped. TLS verification is httpx's default (on).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import httpx

from app.catalog import CatalogEntry, check_hub_url, hub_file_url
from app.download_fetch import DownloadError, RetryableError, Stopped, fetch_to_part
from app.download_jobs import (ACTIVE, FINISHED, RESUMABLE, DownloadEvent, DownloadJob, JobState, ProcessLock,
                               RateMeter, RetryPolicy, file_record, mib, read_queue, write_queue)
from app.store import MANIFEST, ModelFileError, ModelStore, fsync_dir, sha256_file

log = logging.getLogger(__name__)


class DownloadManager:
    """Runs up to `max_parallel` jobs on worker threads; callbacks run on those threads."""

    def __init__(self, store: ModelStore, state_dir: Path, hub_base_url: str, max_parallel: int = 2, *,
                 retry: RetryPolicy | None = None, disk_usage=shutil.disk_usage, opener=open,
                 reserve_bytes: int = 64 << 20, autostart: bool = True, progress_interval_s: float = 0.2):
        self.store = store
        self.state_dir = Path(state_dir)
        self.hub_base_url = check_hub_url(hub_base_url)
        self.max_parallel = max(1, int(max_parallel))
        self.retry = retry or RetryPolicy()
        self._disk_usage = disk_usage
        self._opener = opener
        self._reserve = reserve_bytes
        self._interval = progress_interval_s
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._jobs: dict[str, DownloadJob] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._stop: dict[str, str] = {}  # job_id -> "pause" | "cancel"
        self._subscribers: list[Callable[[DownloadEvent], None]] = []
        self._load()
        if autostart:
            self._pump()

    # --- public API ------------------------------------------------------------------------
    def subscribe(self, callback: Callable[[DownloadEvent], None]) -> Callable[[], None]:
        """Call `callback(event)` on every change; returns a function that unsubscribes."""
        with self._lock:
            self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback) if callback in self._subscribers else None

    def start(self, entry: CatalogEntry) -> str:
        """Queue a download (or resume the unfinished one for the same model); returns the job id."""
        if self.store.get(entry.id) is not None:
            raise ValueError(f"{entry.id} is already installed")
        with self._lock:
            for job in self._jobs.values():
                if job.model_id == entry.id and job.state not in FINISHED:
                    if job.state in RESUMABLE:
                        self._set(job, JobState.QUEUED, error=None)
                    self._pump()
                    return job.job_id
            files = [file_record(f.name, f.size_bytes, f.sha256) for f in entry.files]
            job = DownloadJob(uuid.uuid4().hex[:12], entry.id, entry.to_dict(), files=files,
                              bytes_total=entry.size_bytes)
            self._jobs[job.job_id] = job
            self._set(job, JobState.QUEUED)
            self._pump()
            return job.job_id

    def pause(self, job_id: str) -> None:
        self._halt(job_id, "pause")

    def cancel(self, job_id: str) -> None:
        """Stop and delete the partial files."""
        self._halt(job_id, "cancel")

    def resume(self, job_id: str) -> None:
        with self._lock:
            job = self._get(job_id)
            if job.state in RESUMABLE:
                self._set(job, JobState.QUEUED, error=None)
                self._pump()

    def jobs(self) -> list[DownloadEvent]:
        with self._lock:
            return [self._event(j) for j in self._jobs.values()]

    def wait(self, job_id: str, timeout: float | None = None) -> DownloadEvent:
        """Block until the job is done, failed, cancelled or paused (or the timeout passes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            job = self._get(job_id)
            while job.state in ACTIVE:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._changed.wait(left)
            return self._event(job)

    # --- state -----------------------------------------------------------------------------
    def _get(self, job_id: str) -> DownloadJob:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise KeyError(f"no download job {job_id!r}") from None

    def _halt(self, job_id: str, how: str) -> None:
        with self._lock:
            job = self._get(job_id)
            if job.job_id in self._threads:  # the worker sees the flag between chunks and in backoff
                self._stop[job_id] = how
                self._changed.notify_all()
                return
            if how == "cancel" and job.state not in FINISHED:
                self._delete_parts(job)
                self._set(job, JobState.CANCELLED)
            elif how == "pause" and job.state is JobState.QUEUED:
                self._set(job, JobState.PAUSED)

    def _set(self, job: DownloadJob, state: JobState, error: str | None = None) -> None:
        with self._lock:
            job.state, job.error = state, error
            if state is not JobState.RUNNING:
                job.rate_bps = 0.0
            self._save()
            self._changed.notify_all()
        self._emit(job)

    def _event(self, job: DownloadJob) -> DownloadEvent:
        eta = None
        if job.rate_bps > 0 and job.bytes_total:
            eta = max(0.0, (job.bytes_total - job.bytes_done) / job.rate_bps)
        return DownloadEvent(job.job_id, job.state, job.bytes_done, job.bytes_total, job.rate_bps,
                             eta, job.error, job.model_id)

    def _emit(self, job: DownloadJob) -> None:
        event = self._event(job)
        for cb in list(self._subscribers):
            try:
                cb(event)
            except Exception:
                log.exception("download event callback failed")

    def _save(self) -> None:
        """Write the unfinished jobs; jobs another process added to the file are carried over."""
        keep = [vars(j) | {"rate_bps": 0.0} for j in self._jobs.values() if j.state not in FINISHED]
        foreign = [j for j in read_queue(self.state_dir) if j.get("job_id") not in self._jobs]
        write_queue(self.state_dir, keep + foreign)

    def _load(self) -> None:
        jobs = []
        for raw in read_queue(self.state_dir):
            try:
                jobs.append(DownloadJob(**raw))
            except (TypeError, ValueError) as e:
                log.warning("ignoring a download job in an unknown shape: %s", e)
        for job in jobs:
            if job.state in (JobState.RUNNING, JobState.VERIFYING):
                job.state = JobState.QUEUED  # the process that ran it is gone; the .part files remain
            self._jobs[job.job_id] = job

    def _pump(self) -> None:
        """Start queued jobs while fewer than max_parallel run."""
        with self._lock:
            for job in self._jobs.values():
                if len(self._threads) >= self.max_parallel:
                    break
                if job.state is JobState.QUEUED and job.job_id not in self._threads:
                    t = threading.Thread(target=self._run, args=(job,), name=f"download-{job.model_id}",
                                         daemon=True)
                    self._threads[job.job_id] = t
                    t.start()

    # --- worker ----------------------------------------------------------------------------
    def _run(self, job: DownloadJob) -> None:
        lock = None
        try:
            lock = ProcessLock(self.state_dir / f"{job.model_id}.lock")
            if not lock.acquire():
                raise DownloadError(f"{job.model_id} is being downloaded by another Ember process")
            if self.store.get(job.model_id) is not None:  # another process finished it meanwhile
                self._set(job, JobState.DONE)
                return
            self._set(job, JobState.RUNNING)
            self._transfer(job)
            self._set(job, JobState.VERIFYING)
            self._finish(job)
            self._set(job, JobState.DONE)
        except Stopped:
            with self._lock:
                how = self._stop.get(job.job_id)
            if how == "cancel":
                self._delete_parts(job)
                self._set(job, JobState.CANCELLED)
            else:
                self._set(job, JobState.PAUSED)
        except (DownloadError, ModelFileError) as e:
            self._prune_empty(job)
            self._set(job, JobState.FAILED, error=str(e))
        except Exception as e:  # a bug must not kill the worker silently
            log.exception("download %s crashed", job.job_id)
            self._set(job, JobState.FAILED, error=f"{type(e).__name__}: {e}")
        finally:
            if lock is not None:
                lock.release()
            with self._lock:
                self._threads.pop(job.job_id, None)
                self._stop.pop(job.job_id, None)
                self._changed.notify_all()
            self._pump()

    def _model_dir(self, job: DownloadJob) -> Path:
        """GGUF: the file sits in the model folder; GPTQ/AWQ: the repo's files in `<folder>/model`."""
        d = self.store.model_dir(job.model_id)
        return d if job.entry["format"] == "gguf" else d / "model"

    def _target(self, job: DownloadJob, f: dict) -> Path:
        name = Path(f["name"]).name if job.entry["format"] == "gguf" else f["name"]
        return self._model_dir(job) / name

    def _stopping(self, job: DownloadJob) -> bool:
        return job.job_id in self._stop

    def _check_space(self, job: DownloadJob, need: int) -> None:
        d = self._model_dir(job)
        d.mkdir(parents=True, exist_ok=True)
        free = self._disk_usage(d).free
        if need + self._reserve > free:
            raise DownloadError(f"not enough disk space for {job.model_id}: needs {mib(need)} more "
                                f"(+{mib(self._reserve)} reserve), {mib(free)} free in {d}")

    def _on_disk(self, job: DownloadJob, f: dict) -> int:
        t = self._target(job, f)
        if f["done"]:
            return t.stat().st_size if t.exists() else (f["size_bytes"] or 0)
        part = t.with_name(t.name + ".part")
        return part.stat().st_size if part.exists() else 0

    def _transfer(self, job: DownloadJob) -> None:
        if job.bytes_total is not None:  # known sizes: refuse before the first byte
            self._check_space(job, job.bytes_total - sum(self._on_disk(job, f) for f in job.files))
        for f in job.files:  # a retry after a failed check: a file marked done but gone is fetched again
            if f["done"] and not self._target(job, f).exists():
                f["done"] = False
        timeout = httpx.Timeout(10.0, read=self.retry.read_timeout_s)
        with httpx.Client(timeout=timeout, follow_redirects=True, headers={"User-Agent": "ember"}) as client:
            i = 0
            while i < len(job.files):  # the list can grow: a shard index adds its shards
                f = job.files[i]
                if not f["done"]:
                    self._fetch_with_retries(client, job, f)
                    if f["name"].endswith(".safetensors.index.json"):
                        self._add_shards(job, f)
                i += 1

    def _fetch_with_retries(self, client: httpx.Client, job: DownloadJob, f: dict) -> None:
        target = self._target(job, f)
        part = target.with_name(target.name + ".part")
        part.parent.mkdir(parents=True, exist_ok=True)
        url = hub_file_url(self.hub_base_url, job.entry["repo"], job.entry.get("revision", "main"), f["name"])
        others = sum(self._on_disk(job, g) for g in job.files if g is not f)
        meter = RateMeter()
        last_emit = [0.0]

        def on_bytes(n: int) -> None:
            job.bytes_done = others + n
            job.rate_bps = meter.update(n)
            now = time.monotonic()
            if now - last_emit[0] >= self._interval:
                last_emit[0] = now
                self._emit(job)

        def on_total(n: int) -> None:
            with self._lock:
                if f["size_bytes"] is None:
                    f["size_bytes"] = n
                    if all(g["size_bytes"] is not None for g in job.files):
                        job.bytes_total = sum(g["size_bytes"] for g in job.files)

        failures = total = 0
        while True:
            if self._stopping(job):
                raise Stopped()
            total += 1
            before = part.stat().st_size if part.exists() else 0
            try:
                result = fetch_to_part(client, url, part, expected_size=f["size_bytes"],
                                       expected_sha256=f["sha256"], on_bytes=on_bytes,
                                       should_stop=lambda: self._stopping(job),
                                       check_space=lambda n: self._check_space(job, n), on_total=on_total,
                                       opener=self._opener)
                self._emit(job)  # the last byte count, which throttling may have skipped
                break
            except RetryableError as e:
                after = part.stat().st_size if part.exists() else 0
                failures = 1 if after > before else failures + 1  # progress resets the count
                if failures >= self.retry.attempts or total >= self.retry.max_total:
                    n = failures if failures >= self.retry.attempts else total
                    raise DownloadError(f"{f['name']}: {e} (gave up after {n} attempts)") from e
                wait = min(self.retry.backoff_s * 2 ** (failures - 1), self.retry.backoff_max_s)
                log.info("%s: %s; retrying in %.1fs", f["name"], e, wait)
                with self._lock:
                    self._changed.wait_for(lambda: self._stopping(job), timeout=wait)
        if f["size_bytes"] is None and result.total is not None:
            f["size_bytes"] = result.total
            if all(g["size_bytes"] is not None for g in job.files):
                job.bytes_total = sum(g["size_bytes"] for g in job.files)
        if result.hub_sha256 and f["sha256"] and result.hub_sha256 != f["sha256"]:
            part.unlink(missing_ok=True)
            raise DownloadError(f"{f['name']}: the catalog's sha256 {f['sha256']} differs from the hub's "
                                f"{result.hub_sha256}; refusing the file")
        with self._lock:
            f["hub_sha256"] = result.hub_sha256
            self._save()

    def _add_shards(self, job: DownloadJob, index_file: dict) -> None:
        part = self._target(job, index_file)
        part = part.with_name(part.name + ".part")
        try:
            weight_map = json.loads(part.read_text("utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise DownloadError(f"{index_file['name']}: not a valid safetensors index: {e}") from e
        known = {g["name"] for g in job.files}
        for s in shards:
            if not isinstance(s, str) or "/" in s or "\\" in s or not s.endswith(".safetensors"):
                raise DownloadError(f"{index_file['name']}: unsafe shard name {s!r}")
        with self._lock:
            job.files.extend(file_record(s, None, None) for s in shards if s not in known)
            job.bytes_total = None

    def _finish(self, job: DownloadJob) -> None:
        """Verify every .part, rename them into place, then register (writes the manifest)."""
        for f in job.files:
            if f["done"]:
                continue
            target = self._target(job, f)
            part = target.with_name(target.name + ".part")
            actual = sha256_file(part)
            expected = f["sha256"] or f.get("hub_sha256")
            if expected and actual != expected:
                self._delete_parts(job)  # corrupt: nothing of it may stay, start over next time
                raise DownloadError(f"{f['name']}: sha256 mismatch: expected {expected}, got {actual}; "
                                    "the file was deleted")
            os.replace(part, target)
            fsync_dir(target.parent)
            with self._lock:
                f["sha256"] = actual  # recorded for files the catalog had no hash for
                f["done"] = True
                self._save()
        gguf = job.entry["format"] == "gguf"
        path = self._target(job, job.files[0]) if gguf else self._model_dir(job)
        url = hub_file_url(self.hub_base_url, job.entry["repo"], job.entry.get("revision", "main"),
                           job.files[0]["name"])
        try:
            self.store.register(path, model_id=job.model_id, source="download", url=url,
                                sha256=job.files[0]["sha256"] if gguf else None, name=job.entry["name"])
        except ModelFileError:
            self._delete_parts(job)  # verified bytes, but not a usable model
            raise

    def _prune_empty(self, job: DownloadJob) -> None:
        for d in (self._model_dir(job), self.store.model_dir(job.model_id)):
            try:
                d.rmdir()  # only when empty: kept .part files keep their folder
            except OSError:
                pass

    def _delete_parts(self, job: DownloadJob) -> None:
        """Remove the job's files; the model folder too unless a manifest (a registered model) is in it."""
        for f in job.files:
            target = self._target(job, f)
            target.with_name(target.name + ".part").unlink(missing_ok=True)
        d = self.store.model_dir(job.model_id)
        if not (d / MANIFEST).exists():
            shutil.rmtree(d, ignore_errors=True)


__all__ = ["DownloadManager", "DownloadEvent", "DownloadError", "RetryPolicy", "DownloadJob", "JobState"]
