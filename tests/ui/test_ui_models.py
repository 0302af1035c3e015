"""The model manager against a real DownloadManager and a local HTTP server standing in for the hub."""
from __future__ import annotations

import hashlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.catalog import Catalog, CatalogEntry
from app.downloads import DownloadManager
from app.store import ModelStore
from ui.installed_table import COLUMNS
from ui.model_manager import ModelManagerDialog
from ui_support import tiny_gguf, ui_settings  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(120)
REPO = "test-org/tiny-GGUF"


class SlowFileServer(ThreadingHTTPServer):
    """Serves one file at /{REPO}/resolve/main/<name>, in small chunks with pauses (so progress shows)."""

    daemon_threads = True

    def __init__(self, name: str, data: bytes, chunk: int = 8192, delay_s: float = 0.01) -> None:
        self.name, self.data, self.chunk, self.delay_s = name, data, chunk, delay_s
        self.requests: list[str] = []
        self.hold_at: int | None = None  # stop at this byte until `release` is set (a download that
        self.release = threading.Event()  # is surely unfinished when the test acts)
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        srv: SlowFileServer = self.server
        srv.requests.append(self.headers.get("Range") or "")
        if self.path != f"/{REPO}/resolve/main/{srv.name}":
            self.send_error(404)
            return
        start = 0
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            start = int(rng[6:].split("-")[0])
        body = srv.data[start:]
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(srv.data) - 1}/{len(srv.data)}")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        try:
            for i in range(0, len(body), srv.chunk):
                if srv.hold_at is not None and start + i >= srv.hold_at:
                    srv.release.wait(60)
                self.wfile.write(body[i:i + srv.chunk])
                self.wfile.flush()
                time.sleep(srv.delay_s)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def hub(tiny_gguf):  # noqa: F811
    data = Path(tiny_gguf).read_bytes()
    server = SlowFileServer("tiny.Q8_0.gguf", data, chunk=max(4096, len(data) // 60), delay_s=0.02)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def manager(qtbot, tmp_path, hub, ui_settings):  # noqa: F811
    entry = CatalogEntry.from_dict({
        "id": "tiny-test-q8_0", "name": "Tiny Test", "family": "tiny", "parameters": "1M",
        "architecture": "llama", "quantization": "Q8_0", "format": "gguf", "repo": REPO, "license": "MIT",
        "files": [{"name": hub.name, "size_bytes": len(hub.data), "sha256": hashlib.sha256(hub.data).hexdigest()}],
    }, hub_base_url=hub.url)
    store = ModelStore(tmp_path / "models")
    downloads = DownloadManager(store, tmp_path / "downloads", hub.url, progress_interval_s=0.0)
    dialog = ModelManagerDialog(store, Catalog([entry]), downloads, ui_settings)
    qtbot.addWidget(dialog)
    dialog.show()
    return dialog, entry


def test_download_shows_progress_then_installs(qtbot, manager):
    dialog, entry = manager
    fractions = []
    dialog.bridge.event.connect(lambda e: fractions.append((e.state, e.bytes_done / (e.bytes_total or 1))))
    button = dialog.catalog_table.button_for(entry.id)
    assert button.text() == "Download"
    with qtbot.waitSignal(dialog.model_installed, timeout=60_000) as installed:
        qtbot.mouseClick(button, Qt.LeftButton)
    assert installed.args == [entry.id]
    partial = [f for s, f in fractions if s == "running" and 0 < f < 1]
    assert len(partial) >= 3, f"expected visible progress, got {fractions}"
    assert partial == sorted(partial)
    row = dialog.downloads_panel.rows[next(iter(dialog.downloads_panel.rows))]
    assert row.progress.value() == row.progress.maximum() and row.detail.text() == "installed"
    assert entry.id in dialog.installed.model_ids()
    assert dialog.catalog_table.button_for(entry.id).text() == "Installed"
    assert dialog.store.verify(entry.id)


def test_pause_resume_cancel(qtbot, manager, hub):
    dialog, entry = manager
    hub.delay_s, hub.hold_at = 0.05, len(hub.data) // 2
    job = dialog.start_download(entry)
    row = dialog.downloads_panel.rows[job]
    qtbot.waitUntil(lambda: 0 < row.progress.value() < 1000 and row.state == "running", timeout=30_000)
    qtbot.mouseClick(row.pause_button, Qt.LeftButton)
    hub.release.set()  # the worker sees the pause at the next chunk
    qtbot.waitUntil(lambda: row.state == "paused", timeout=10_000)
    assert row.pause_button.text() == "Resume" and "paused" in row.detail.text()
    hub.delay_s = 0.0
    with qtbot.waitSignal(dialog.model_installed, timeout=60_000):
        qtbot.mouseClick(row.pause_button, Qt.LeftButton)
    assert any(r.startswith("bytes=") for r in hub.requests), "the resume should continue with a Range request"
    assert dialog.store.verify(entry.id)

    dialog.installed.delete(entry.id)
    hub.delay_s = 0.05
    hub.release.clear()
    job = dialog.start_download(entry)
    row = dialog.downloads_panel.rows[job]
    qtbot.waitUntil(lambda: row.state == "running" and row.progress.value() > 0, timeout=30_000)
    qtbot.mouseClick(row.cancel_button, Qt.LeftButton)
    hub.release.set()
    qtbot.waitUntil(lambda: row.state == "cancelled", timeout=10_000)
    assert dialog.store.get(entry.id) is None


def test_installed_verify_import_default_delete(qtbot, manager, tiny_gguf, ui_settings):  # noqa: F811
    dialog, _entry = manager
    table = dialog.installed
    with qtbot.waitSignal(table.changed, timeout=30_000):
        assert table.import_file(tiny_gguf) is not None
    (model_id,) = table.model_ids()
    status = COLUMNS.index("Status")
    assert table.table.item(0, COLUMNS.index("Uses")).text() == "chat, embeddings"  # a chat model embeds too
    table.verify(model_id)
    qtbot.waitUntil(lambda: "checksum OK" in table.table.item(0, status).text(), timeout=30_000)
    Path(dialog.store.get(model_id).path).write_bytes(b"GGUF corrupted")
    table.verify(model_id)
    qtbot.waitUntil(lambda: "mismatch" in table.table.item(0, status).text(), timeout=30_000)
    table.set_default(model_id)
    assert ui_settings.default_model == model_id and "default" in table.table.item(0, 0).text()
    table.delete(model_id)
    assert table.model_ids() == []

