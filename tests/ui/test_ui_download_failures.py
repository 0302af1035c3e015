"""A failed download is visible and fixable (issue 16 item 4): a short message, Retry and Remove, and the
dialog keeps its width; offline (no DNS) fails at once instead of retrying. Real DownloadManager, a local
HTTP server standing in for the hub (test_ui_models' fixtures), real widgets offscreen."""
from __future__ import annotations

import time

import pytest
from PySide6.QtCore import Qt

from app.catalog import CatalogEntry
from app.download_jobs import RetryPolicy
from app.downloads import DownloadManager
from app.store import ModelStore
from test_ui_models import REPO, hub, manager  # noqa: F401 - fixtures
from ui.downloads_panel import short_error
from ui_support import tiny_gguf, ui_settings  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(120)
OFFLINE_HUB = "http://hub.ember-test.invalid"  # .invalid never resolves (RFC 6761): the offline case


def offline_entry(model_id: str = "offline-q8_0") -> CatalogEntry:
    return CatalogEntry.from_dict({
        "id": model_id, "name": "Offline Test", "family": "tiny", "parameters": "1M", "architecture": "llama",
        "quantization": "Q8_0", "format": "gguf", "repo": REPO, "license": "MIT",
        "files": [{"name": "offline.Q8_0.gguf", "size_bytes": 123456, "sha256": "0" * 64}],
    }, hub_base_url=OFFLINE_HUB)


def test_no_dns_is_not_retried_as_a_transient_error(tmp_path):
    downloads = DownloadManager(ModelStore(tmp_path / "models"), tmp_path / "dl", OFFLINE_HUB,
                                retry=RetryPolicy(attempts=6, backoff_s=2.0))
    t0 = time.monotonic()
    job = downloads.start(offline_entry())
    event = downloads.wait(job, timeout=60)
    assert event.state == "failed" and "no network" in event.error
    assert time.monotonic() - t0 < 5, "a DNS failure was retried with backoff"


def test_a_failed_download_shows_a_short_message_retry_and_remove(qtbot, manager, hub):
    dialog, entry = manager
    dialog.tabs.setCurrentWidget(dialog.downloads_panel)
    hub.delay_s, hub.hold_at = 0.05, len(hub.data) // 2  # a second download stays running meanwhile
    running = dialog.start_download(entry)
    panel = dialog.downloads_panel
    qtbot.waitUntil(lambda: panel.rows[running].state == "running", timeout=30_000)
    width = dialog.width()

    job = panel.start(offline_entry())  # the manager's hub has no such file: HTTP 404
    row = panel.rows[job]
    qtbot.waitUntil(lambda: row.state == "failed", timeout=30_000)
    text = row.detail.text()
    assert text.startswith("Failed: ") and len(text) < 80 and "http" not in text, text
    assert text == "Failed: The hub has no such file (HTTP 404)"
    assert "/resolve/main/offline.Q8_0.gguf" in row.detail.toolTip() and row.progress.maximum() > 0  # no busy bar
    assert row.pause_button.text() == "Retry" and row.pause_button.isEnabled()
    assert row.cancel_button.text() == "Remove" and row.cancel_button.isEnabled()
    qtbot.wait(50)
    assert dialog.width() == width, "the error widened the dialog"
    assert panel.rows[running].state == "running" and panel.rows[running].cancel_button.text() == "Cancel"

    qtbot.mouseClick(row.pause_button, Qt.LeftButton)  # Retry: runs again (and fails again)
    qtbot.waitUntil(lambda: row.state == "failed" and row.pause_button.text() == "Retry", timeout=30_000)
    later = panel.start(offline_entry("offline-2"))  # a row below the one removed next
    qtbot.waitUntil(lambda: panel.rows[later].state == "failed", timeout=30_000)
    qtbot.mouseClick(row.cancel_button, Qt.LeftButton)  # Remove
    assert job not in panel.rows and running in panel.rows and later in panel.rows
    qtbot.wait(100)
    assert job not in panel.rows, "a late event brought the removed row back"
    newest = panel.start(offline_entry("offline-3"))  # a new row takes a line of its own
    tops = lambda: [panel.rows[r].detail.geometry().top() for r in (running, later, newest)]  # noqa: E731
    qtbot.waitUntil(lambda: panel.rows[newest].detail.geometry().isValid() and panel.rows[newest].state == "failed",
                    timeout=30_000)
    qtbot.wait(50)
    assert len(set(tops())) == 3, f"rows overlap: {tops()}"
    hub.release.set()
    qtbot.waitUntil(lambda: panel.rows[running].state == "done", timeout=60_000)


def test_short_error_keeps_the_cause_and_drops_the_noise():
    raw = ("model.Q4_K_M.gguf: ConnectError: [Errno 111] Connection refused "
           "(https://huggingface.co/org/repo/resolve/main/model.Q4_K_M.gguf) (gave up after 6 attempts)")
    assert short_error(raw) == "Connection refused"
    assert short_error(None) == "Unknown error"
    assert short_error("https://h/r/resolve/main/m.gguf: the server's file has 42 bytes, expected 41") == \
        "The server's file has 42 bytes, expected 41"
    assert short_error("/home/u/.local/share/ember/models/x/x.gguf: not a GGUF file (magic b'\\x00')") == \
        "Not a GGUF file (magic b'\\x00')"
    assert short_error("no network: cannot look up huggingface.co (check the connection, then Retry)") == \
        "No network: cannot look up huggingface.co (check the connection, then Retry)"
