"""Downloads in progress: a progress bar per job with pause/resume/cancel, fed by DownloadEvents."""
from __future__ import annotations

import re
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QGridLayout, QLabel, QProgressBar, QPushButton, QSizePolicy, QVBoxLayout, QWidget

from app.download_jobs import ACTIVE, JobState
from ui.catalog_table import human_size
from ui.elided_label import ElidedLabel


def short_error(error: str | None) -> str:
    """The first clause of a download error, without the URL and exception class (the tooltip has it all)."""
    text = (error or "unknown error").splitlines()[0]
    text = re.sub(r"\s*\((?:https?://|gave up)[^)]*\)", "", text)  # "(https://…)", "(gave up after 6 attempts)"
    text = re.sub(r":? ?https?://\S+", "", text).strip(" :")  # "HTTP 404 Not Found: https://…", "https://…: …"
    text = re.sub(r"^\S*?[\w.-]+\.(?:gguf|safetensors|json)(?:\.part)?: ", "", text)  # the file: the row names the model
    text = re.sub(r"\[Errno -?\d+\] ", "", text)
    text = re.sub(r"^HTTP 404 Not Found$", "the hub has no such file (HTTP 404)", text)
    text = re.sub(r"^(?:ConnectError|ConnectTimeout|ReadTimeout|ReadError|RemoteProtocolError): ", "", text)
    return text[:1].upper() + text[1:]


def describe(event: Any) -> str:
    """'12.0 MiB of 40.0 MiB · 3.1 MiB/s · 9 s left' (or the state when there is nothing to count)."""
    state = event.state
    if state == "failed":
        return f"Failed: {short_error(event.error)}"
    fixed = {"done": "installed", "cancelled": "cancelled", "queued": "waiting…", "verifying": "verifying checksum…"}
    if state in fixed:
        return fixed[state]
    if not event.bytes_total:
        return f"{human_size(event.bytes_done)} so far" if event.bytes_done else "connecting…"
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
        self.detail = ElidedLabel("waiting…", parent)  # a long error must not widen the dialog
        self.detail.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)  # its column's width, not its text's
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
        elif event.state == "failed" and self.progress.maximum() == 0:
            self.progress.setRange(0, 1000)  # no busy bar for a download that is not running
            self.progress.setValue(0)
        self.progress.setTextVisible(event.state != "failed")
        failed = event.state == "failed"
        self.detail.setText(describe(event))
        self.detail.setProperty("failed", failed)
        self.detail.setToolTip(event.error if failed else "")
        self.detail.style().polish(self.detail)
        self.pause_button.setText({"paused": "Resume", "failed": "Retry"}.get(event.state, "Pause"))
        self.pause_button.setEnabled(event.state in ("running", "queued", "paused", "failed"))
        self.cancel_button.setText("Remove" if failed else "Cancel")
        self.cancel_button.setToolTip("Delete what was downloaded and take it off this list" if failed else "")
        self.cancel_button.setEnabled(event.state in ACTIVE | {JobState.PAUSED, JobState.FAILED})

    def widgets(self) -> tuple:
        return self.name, self.progress, self.detail, self.pause_button, self.cancel_button


class DownloadsPanel(QWidget):
    """`finished(job_id, state)` when a job ends (done, failed, cancelled)."""

    finished = Signal(str, str)

    def __init__(self, downloads: Any, bridge: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.downloads = downloads
        self.rows: dict[str, DownloadRow] = {}
        self.removed: set[str] = set()  # jobs the user took off the list: their late events are ignored
        self._next_row = 0
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
        self.removed.discard(job_id)
        self._row(job_id, getattr(entry, "name", str(entry)))
        return job_id

    def _row(self, job_id: str, name: str) -> DownloadRow:
        row = self.rows.get(job_id)
        if row is None:
            row = DownloadRow(name, self)
            i = self._next_row  # not len(rows): a removed row leaves its grid line behind
            self._next_row += 1
            self.grid.addWidget(row.name, i, 0)
            self.grid.addWidget(row.progress, i, 1)
            self.grid.addWidget(row.detail, i, 2)
            self.grid.addWidget(row.pause_button, i, 3)
            self.grid.addWidget(row.cancel_button, i, 4)
            self.grid.setColumnStretch(1, 1)
            self.grid.setColumnStretch(2, 1)
            self.grid.setColumnMinimumWidth(2, 300)  # the progress bars keep their width as the text changes
            row.pause_button.clicked.connect(lambda _=False, j=job_id: self._on_pause_clicked(j))
            row.cancel_button.clicked.connect(lambda _=False, j=job_id: self._on_cancel_clicked(j))
            self.rows[job_id] = row
            self.empty.hide()
        return row

    def _on_event(self, event: Any) -> None:
        if event.job_id in self.removed:
            return
        row = self._row(event.job_id, self._job_name(event.job_id))
        before = row.state
        row.update(event)
        if event.state in ("done", "failed", "cancelled") and before != event.state:
            self.finished.emit(event.job_id, event.state)

    def _on_pause_clicked(self, job_id: str) -> None:
        row = self.rows[job_id]
        if row.state in ("paused", "failed"):  # Resume / Retry
            self.downloads.resume(job_id)
        else:
            self.downloads.pause(job_id)

    def _on_cancel_clicked(self, job_id: str) -> None:
        row = self.rows[job_id]
        removing = row.state == "failed"
        self.downloads.cancel(job_id)  # deletes the partial files
        if removing:
            self.remove_row(job_id)

    def remove_row(self, job_id: str) -> None:
        """Take a job's row off the panel (its widgets go; the grid keeps its other rows)."""
        row = self.rows.pop(job_id, None)
        if row is None:
            return
        for w in row.widgets():
            self.grid.removeWidget(w)
            w.deleteLater()
        self.removed.add(job_id)
        if not self.rows:
            self.empty.setText("No downloads. Pick a model in the catalog.")
            self.empty.show()

    def _job_name(self, job_id: str) -> str:
        for job in self.downloads.jobs():
            if job.job_id == job_id:
                return getattr(job, "model_id", "") or job_id
        return job_id
