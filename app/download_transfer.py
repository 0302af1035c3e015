"""One download job's bytes: each file fetched into its `.part` (resumed, retried with backoff),
verified against its sha256, renamed into place, and the model registered in the store; and the
job's files removed again when it is cancelled or corrupt. Runs on a DownloadManager worker thread.

The queue passes in its condition (pause and cancel notify it), how to tell that a job is asked to
stop, and how to report progress and save the queue; the transfer never touches the queue itself.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from app.catalog import hub_file_url
from app.download_fetch import DownloadError, RetryableError, Stopped, fetch_to_part
from app.download_jobs import DownloadJob, RateMeter, RetryPolicy, file_record, mib
from app.store import MANIFEST, ModelFileError, ModelStore, fsync_dir, sha256_file

log = logging.getLogger(__name__)


class JobTransfer:
    """`transfer(job)` then `finish(job)`; raises Stopped, DownloadError or ModelFileError."""

    def __init__(self, store: ModelStore, hub_base_url: str, retry: RetryPolicy, changed: threading.Condition,
                 stopping: Callable[[DownloadJob], bool], emit: Callable[[DownloadJob], None],
                 save: Callable[[], None], *, disk_usage, opener, reserve_bytes: int, progress_interval_s: float):
        self._store = store
        self._hub_base_url = hub_base_url
        self._retry = retry
        self._changed = changed
        self._stopping = stopping
        self._emit = emit
        self._save = save
        self._disk_usage = disk_usage
        self._opener = opener
        self._reserve = reserve_bytes
        self._interval = progress_interval_s

    def _model_dir(self, job: DownloadJob) -> Path:
        """GGUF: the file sits in the model folder; GPTQ/AWQ: the repo's files in `<folder>/model`."""
        d = self._store.model_dir(job.model_id)
        return d if job.entry["format"] == "gguf" else d / "model"

    def _target(self, job: DownloadJob, f: dict) -> Path:
        name = Path(f["name"]).name if job.entry["format"] == "gguf" else f["name"]
        return self._model_dir(job) / name

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

    def transfer(self, job: DownloadJob) -> None:
        """Fetch every file of the job into its .part (resuming, retrying); a shard index adds its shards."""
        if job.bytes_total is not None:  # known sizes: refuse before the first byte
            self._check_space(job, job.bytes_total - sum(self._on_disk(job, f) for f in job.files))
        for f in job.files:  # a retry after a failed check: a file marked done but gone is fetched again
            if f["done"] and not self._target(job, f).exists():
                f["done"] = False
        timeout = httpx.Timeout(10.0, read=self._retry.read_timeout_s)
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
        url = hub_file_url(self._hub_base_url, job.entry["repo"], job.entry.get("revision", "main"), f["name"])
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
            with self._changed:
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
                if failures >= self._retry.attempts or total >= self._retry.max_total:
                    n = failures if failures >= self._retry.attempts else total
                    raise DownloadError(f"{f['name']}: {e} (gave up after {n} attempts)") from e
                wait = min(self._retry.backoff_s * 2 ** (failures - 1), self._retry.backoff_max_s)
                log.info("%s: %s; retrying in %.1fs", f["name"], e, wait)
                with self._changed:
                    self._changed.wait_for(lambda: self._stopping(job), timeout=wait)
        if f["size_bytes"] is None and result.total is not None:
            f["size_bytes"] = result.total
            if all(g["size_bytes"] is not None for g in job.files):
                job.bytes_total = sum(g["size_bytes"] for g in job.files)
        if result.hub_sha256 and f["sha256"] and result.hub_sha256 != f["sha256"]:
            part.unlink(missing_ok=True)
            raise DownloadError(f"{f['name']}: the catalog's sha256 {f['sha256']} differs from the hub's "
                                f"{result.hub_sha256}; refusing the file")
        with self._changed:
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
        with self._changed:
            job.files.extend(file_record(s, None, None) for s in shards if s not in known)
            job.bytes_total = None

    def finish(self, job: DownloadJob) -> None:
        """Verify every .part, rename them into place, then register (writes the manifest)."""
        for f in job.files:
            if f["done"]:
                continue
            target = self._target(job, f)
            part = target.with_name(target.name + ".part")
            actual = sha256_file(part)
            expected = f["sha256"] or f.get("hub_sha256")
            if expected and actual != expected:
                self.delete_parts(job)  # corrupt: nothing of it may stay, start over next time
                raise DownloadError(f"{f['name']}: sha256 mismatch: expected {expected}, got {actual}; "
                                    "the file was deleted")
            os.replace(part, target)
            fsync_dir(target.parent)
            with self._changed:
                f["sha256"] = actual  # recorded for files the catalog had no hash for
                f["done"] = True
                self._save()
        gguf = job.entry["format"] == "gguf"
        path = self._target(job, job.files[0]) if gguf else self._model_dir(job)
        url = hub_file_url(self._hub_base_url, job.entry["repo"], job.entry.get("revision", "main"),
                           job.files[0]["name"])
        proj = next((f for f in job.files if f["name"] == job.entry.get("mmproj")), None)  # a vision model's
        try:
            self._store.register(path, model_id=job.model_id, source="download", url=url,
                                sha256=job.files[0]["sha256"] if gguf else None, name=job.entry["name"],
                                mmproj=self._target(job, proj) if proj else None,
                                mmproj_sha256=proj["sha256"] if proj else None)
        except ModelFileError:
            self.delete_parts(job)  # verified bytes, but not a usable model
            raise

    def prune_empty(self, job: DownloadJob) -> None:
        for d in (self._model_dir(job), self._store.model_dir(job.model_id)):
            try:
                d.rmdir()  # only when empty: kept .part files keep their folder
            except OSError:
                pass

    def delete_parts(self, job: DownloadJob) -> None:
        """Remove the job's files; the model folder too unless a manifest (a registered model) is in it."""
        for f in job.files:
            target = self._target(job, f)
            target.with_name(target.name + ".part").unlink(missing_ok=True)
        d = self._store.model_dir(job.model_id)
        if not (d / MANIFEST).exists():
            shutil.rmtree(d, ignore_errors=True)
