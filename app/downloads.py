"""Downloads of catalog models: resumable, retried, verified, and never registered half-done.

Each job downloads its file(s) into `<models root>/<model id>/…/<file>.part` (see
download_fetch), then checks sha256 (the catalog's, else the hub's X-Linked-Etag/ETag, else
records what it computed), renames each `.part` atomically, and only then writes the store
manifest: app/download_transfer.py does that for one job; this module is the queue. The queue is
persisted as JSON under `state_dir`, and `.part` files are kept, so a restarted process resumes
where the last one stopped. TLS verification is httpx's default (on).
"""
from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

from app.catalog import CatalogEntry, check_hub_url
from app.download_fetch import DownloadError, Stopped
from app.download_jobs import (ACTIVE, FINISHED, RESUMABLE, DownloadEvent, DownloadJob, JobState, ProcessLock,
                               RetryPolicy, file_record, read_queue, write_queue)
from app.download_transfer import JobTransfer
from app.store import ModelFileError, ModelStore
from engine.model_files.projector import mrope_refusal

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
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._transfer = JobTransfer(store, self.hub_base_url, self.retry, self._changed, self._stopping, self._emit,
                                     self._save, disk_usage=disk_usage, opener=opener, reserve_bytes=reserve_bytes,
                                     progress_interval_s=progress_interval_s)
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
        if entry.mmproj and (why := mrope_refusal(entry.id, entry.architecture)):
            raise ValueError(why)  # before a byte: the pair would be refused once downloaded
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
                self._transfer.delete_parts(job)
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
            self._transfer.transfer(job)
            self._set(job, JobState.VERIFYING)
            self._transfer.finish(job)
            self._set(job, JobState.DONE)
        except Stopped:
            with self._lock:
                how = self._stop.get(job.job_id)
            if how == "cancel":
                self._transfer.delete_parts(job)
                self._set(job, JobState.CANCELLED)
            else:
                self._set(job, JobState.PAUSED)
        except (DownloadError, ModelFileError) as e:
            self._transfer.prune_empty(job)
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

    def _stopping(self, job: DownloadJob) -> bool:
        return job.job_id in self._stop

__all__ = ["DownloadManager", "DownloadEvent", "DownloadError", "RetryPolicy", "DownloadJob", "JobState"]
