"""Downloads in progress: a progress bar per job with pause/resume/cancel, fed by DownloadEvents."""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QGridLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget)

from app.download_jobs import ACTIVE, JobState
from ui.catalog_table import human_size


def describe(event: Any) -> str:
    """'12.0 MiB of 40.0 MiB · 3.1 MiB/s · 9 s left' (or the state when there is nothing to count)."""
    state = event.state
    if state == "failed":
        return f"failed: {event.error or 'unknown error'}"
    fixed = {"done": "installed", "cancelled": "cancelled", "queued": "waiting…", "verifying": "verifying checksum…"}
    if state in fixed:
        return fixed[state]
    text = f"{human_size(event.bytes_done)} of {human_size(event.bytes_total)}"
    if state == "paused":
        return text + " · paused"
    if event.rate_bps:
        text += f" · {human_size(int(event.rate_bps))}/s"
    if event.eta_s is not None:
        text += f" · {int(event.eta_s)} s left"
    return text


class DownloadRow:
    """The widgets of one job (kept in a grid, not a widget of its own, so columns line up)."""

    def __init__(self, name: str, parent: QWidget) -> None:
        self.name = QLabel(name, parent)
        self.progress = QProgressBar(parent, minimum=0, maximum=1000)
        self.detail = QLabel("waiting…", parent)
        self.pause_button = QPushButton("Pause", parent)
        self.cancel_button = QPushButton("Cancel", parent)
        self.state = "queued"

    def update(self, event: Any) -> None:
        self.state = event.state
        total = event.bytes_total or 0
        if total:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(1000 * min(1.0, event.bytes_done / total)))
        elif event.state == "running":
            self.progress.setRange(0, 0)  # size unknown yet: busy bar
        if event.state == "done":
            self.progress.setRange(0, 1000)
            self.progress.setValue(1000)
        self.detail.setText(describe(event))
        self.pause_button.setText("Resume" if event.state == "paused" else "Pause")
        self.pause_button.setEnabled(event.state in ("running", "queued", "paused"))
        self.cancel_button.setEnabled(event.state in ACTIVE | {JobState.PAUSED})


class DownloadsPanel(QWidget):
    """`finished(job_id, state)` when a job ends (done, failed, cancelled)."""

    finished = Signal(str, str)

    def __init__(self, downloads: Any, bridge: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.downloads = downloads
        self.rows: dict[str, DownloadRow] = {}
        self.grid = QGridLayout()
        self.empty = QLabel("No downloads. Pick a model in the catalog.", self)
        layout = QVBoxLayout(self)
        layout.addWidget(self.empty)
        layout.addLayout(self.grid)
        layout.addStretch(1)
        bridge.event.connect(self._on_event)

    def start(self, entry: Any) -> str | None:
        try:
            job_id = self.downloads.start(entry)
        except (ValueError, OSError) as e:  # already installed, no disk space, bad entry
            self.empty.setText(f"Cannot download {getattr(entry, 'name', entry)}: {e}")
            self.empty.show()
            return None
        self._row(job_id, getattr(entry, "name", str(entry)))
        return job_id

    def _row(self, job_id: str, name: str) -> DownloadRow:
        row = self.rows.get(job_id)
        if row is None:
            row = DownloadRow(name, self)
            i = len(self.rows)
            self.grid.addWidget(row.name, i, 0)
            self.grid.addWidget(row.progress, i, 1)
            self.grid.addWidget(row.detail, i, 2)
            self.grid.addWidget(row.pause_button, i, 3)
            self.grid.addWidget(row.cancel_button, i, 4)
            self.grid.setColumnStretch(1, 1)
            row.pause_button.clicked.connect(lambda _=False, j=job_id: self._on_pause_clicked(j))
            row.cancel_button.clicked.connect(lambda _=False, j=job_id: self.downloads.cancel(j))
            self.rows[job_id] = row
            self.empty.hide()
        return row

    def _on_event(self, event: Any) -> None:
        row = self._row(event.job_id, self._job_name(event.job_id))
        before = row.state
        row.update(event)
        if event.state in ("done", "failed", "cancelled") and before != event.state:
            self.finished.emit(event.job_id, event.state)

    def _on_pause_clicked(self, job_id: str) -> None:
        row = self.rows[job_id]
        if row.state == "paused":
            self.downloads.resume(job_id)
        else:
            self.downloads.pause(job_id)

    def _job_name(self, job_id: str) -> str:
        for job in self.downloads.jobs():
            if job.job_id == job_id:
                return getattr(job, "model_id", "") or job_id
        return job_id
