"""The pieces of a download job that outlive a process: its record, its events, the queue file,
and the per-model lock that keeps two processes off the same `.part` file."""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from app.store import write_json_atomic

log = logging.getLogger(__name__)

QUEUE_FILE = "downloads.json"


class JobState(StrEnum):
    """A download job's state; str-valued, so the queue file and the events carry plain names."""

    QUEUED = "queued"  # waiting for a worker (also a job resumed, or found running by a dead process)
    RUNNING = "running"
    PAUSED = "paused"
    VERIFYING = "verifying"  # sha256 of the whole file, then the rename and the manifest
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"  # its partial files are deleted


ACTIVE = frozenset({JobState.QUEUED, JobState.RUNNING, JobState.VERIFYING})  # wait() blocks on these
FINISHED = frozenset({JobState.DONE, JobState.CANCELLED})  # not kept in the queue file
RESUMABLE = frozenset({JobState.PAUSED, JobState.FAILED})


@dataclass(frozen=True)
class DownloadEvent:
    job_id: str
    state: JobState
    bytes_done: int
    bytes_total: int | None
    rate_bps: float
    eta_s: float | None
    error: str | None
    model_id: str = ""


@dataclass
class RetryPolicy:
    attempts: int = 6  # attempts in a row without progress before giving up
    backoff_s: float = 1.0  # first wait; doubles each time
    backoff_max_s: float = 30.0
    read_timeout_s: float = 30.0  # a server silent this long counts as a dropped connection
    max_total: int = 100  # attempts per file in all, progress or not: a server that drops every
    #                       connection after a few bytes still ends in a clear failure


@dataclass
class DownloadJob:
    job_id: str
    model_id: str
    entry: dict  # CatalogEntry.to_dict(): the job survives a catalog change
    state: JobState = JobState.QUEUED
    files: list[dict] = field(default_factory=list)  # name, size_bytes, sha256, done
    error: str | None = None
    bytes_done: int = 0
    bytes_total: int | None = None
    rate_bps: float = 0.0

    def __post_init__(self) -> None:
        self.state = JobState(self.state)  # the queue file holds the plain name; ValueError for an unknown one


def read_queue(state_dir: Path) -> list[dict]:
    """The persisted jobs (dicts); an unreadable file is logged and treated as empty."""
    p = Path(state_dir) / QUEUE_FILE
    try:
        jobs = json.loads(p.read_text("utf-8"))["jobs"]
        return [j for j in jobs if isinstance(j, dict)]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("ignoring unreadable download queue %s: %s", p, e)
        return []


def write_queue(state_dir: Path, jobs: list[dict]) -> None:
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(state_dir) / QUEUE_FILE, {"version": 1, "jobs": jobs})


def file_record(name: str, size_bytes: int | None, sha256: str | None) -> dict:
    return {"name": name, "size_bytes": size_bytes, "sha256": sha256, "hub_sha256": None, "done": False}


class ProcessLock:
    """An exclusive lock file (flock), so two processes never write the same .part; the OS
    releases it when a process dies, even by SIGKILL. Where flock is missing, always granted."""

    def __init__(self, path: Path):
        self.path, self.fd = path, None

    def acquire(self) -> bool:
        try:
            import fcntl
        except ImportError:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            os.close(self.fd)
            self.fd = None
            return False

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


class RateMeter:
    """Bytes per second, smoothed (exponential moving average over ~2 s)."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.n0 = None
        self.rate = 0.0

    def update(self, n: int) -> float:
        now = time.monotonic()
        if self.n0 is None or n < self.n0:
            self.t0, self.n0 = now, n
            return self.rate
        dt = now - self.t0
        if dt >= 0.1:
            inst = (n - self.n0) / dt
            alpha = min(1.0, dt / 2.0)
            self.rate = inst if self.rate == 0 else (1 - alpha) * self.rate + alpha * inst
            self.t0, self.n0 = now, n
        return self.rate


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
