"""The hub's own metadata and search (issue 16 item 5), against a local fake of the hub's API — the one fake
these tests allow, since no hub can be reached here (tests/hub_api_fake.py; huggingface_hub's real HfApi
talks to it). Search, each file's size and sha256 from the metadata, then a download that verifies;
in the model manager: a size or estimate on every catalog row, distinct names, hub search and download."""
from __future__ import annotations

import json
import threading
import time

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel

from app.catalog import Catalog, CatalogEntry
from app.cli import main
from app.downloads import DownloadManager
from app.fit import fit_advice, probe_host
from app.hub import HubError, gguf_entries, search_gguf, with_hub_facts
from app.store import ModelStore
from hub_api_fake import add_repo
from store_helpers import FakeHub, sha256, write_tiny_gguf
from ui.model_manager import ModelManagerDialog
from ui_support import make_settings

pytestmark = pytest.mark.timeout(120)
REPO = "acme/Tiny-0.5B-Instruct-GGUF"
OFFLINE = "http://hub.ember-test.invalid"


@pytest.fixture
def hub(tmp_path):
    files = {"tiny-0.5b-instruct-q4_k_m.gguf": write_tiny_gguf(tmp_path / "a.gguf", seed=1).read_bytes(),
             "tiny-0.5b-instruct-q8_0.gguf": write_tiny_gguf(tmp_path / "b.gguf", seed=2).read_bytes()}
    with FakeHub() as server:
        add_repo(server, REPO, files, downloads=500)
        add_repo(server, "other/Unrelated-7B-GGUF", {"unrelated-7b.Q4_0.gguf": b"GGUF" + b"\0" * 64}, downloads=9)
        server.data = files
        server.api_open = threading.Event()  # cleared by `held_api`: the hub answers once it is set again
        server.api_open.set()
        for route, answer in list(server.api.items()):
            server.api[route] = lambda q, answer=answer: server.api_open.wait(30) and answer(q)
        yield server


@pytest.fixture
def held_api(hub):
    """The hub's API answers nothing until the test sets `hub.api_open`: a window opened meanwhile
    shows what it shows before the hub has answered, whatever the machine's speed."""
    hub.api_open.clear()
    yield hub.api_open
    hub.api_open.set()


def test_search_and_file_facts_come_from_the_hub(hub):
    assert [r.repo for r in search_gguf(hub.base_url, "tiny instruct")] == [REPO]
    assert [r.repo for r in search_gguf(hub.base_url, "")] == [REPO, "other/Unrelated-7B-GGUF"]
    entries = {e.file: e for e in gguf_entries(hub.base_url, REPO)}
    assert set(entries) == set(hub.data)  # README.md is not a model
    for name, data in hub.data.items():
        assert entries[name].size_bytes == len(data) and entries[name].sha256 == sha256(data)
    assert entries["tiny-0.5b-instruct-q8_0.gguf"].quantization == "Q8_0"
    assert entries["tiny-0.5b-instruct-q8_0.gguf"].parameters == "0.5B"


def test_cli_search_hub_then_pull_verifies(hub, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "home"))
    flags = ["--hub-base-url", hub.base_url]
    assert main(["models", "search", "--hub", "tiny", *flags]) == 0
    out = capsys.readouterr().out
    assert "tiny-0.5b-instruct-q4_k_m" in out and REPO in out and "KiB" in out
    assert main(["models", "search", "--hub", "tiny", "--json", *flags]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    want = sha256(hub.data["tiny-0.5b-instruct-q4_k_m.gguf"])
    assert rows["tiny-0.5b-instruct-q4_k_m"]["files"][0]["sha256"] == want

    assert main(["models", "pull", "tiny-0.5b-instruct-q4_k_m", "--hub", REPO, "--no-progress", *flags]) == 0
    store = ModelStore(tmp_path / "home" / "data" / "models")
    installed = store.get("tiny-0.5b-instruct-q4_k_m")
    assert installed.sha256 == want and store.verify(installed.id)

    good = hub.data["tiny-0.5b-instruct-q8_0.gguf"]
    hub.files[f"/{REPO}/resolve/main/tiny-0.5b-instruct-q8_0.gguf"] = good[:-8] + b"\1" * 8  # not what it says
    assert main(["models", "pull", "tiny-0.5b-instruct-q8_0", "--hub", REPO, "--no-progress", *flags]) == 1
    assert "sha256" in capsys.readouterr().err and store.get("tiny-0.5b-instruct-q8_0") is None


def test_offline_hub_fails_at_once_and_the_catalog_keeps_estimates():
    t0 = time.monotonic()
    with pytest.raises(HubError, match="no network"):
        search_gguf(OFFLINE, "qwen")
    with pytest.raises(HubError, match="no network"):
        with_hub_facts(OFFLINE, list(Catalog.load(hub_base_url=OFFLINE)))
    assert time.monotonic() - t0 < 3


def catalog_entry(model_id: str, name: str, quant: str, file: str, size: int | None = None) -> CatalogEntry:
    return CatalogEntry.from_dict({
        "id": model_id, "name": name, "family": "tiny", "parameters": "0.5B", "architecture": "llama",
        "quantization": quant, "format": "gguf", "repo": REPO, "license": "MIT",
        "files": [{"name": file, "size_bytes": size, "sha256": None}]})


@pytest.fixture
def manager(qtbot, tmp_path, hub):
    settings = make_settings(tmp_path / "ember", hub_base_url=hub.base_url)
    store = ModelStore(tmp_path / "models")
    downloads = DownloadManager(store, tmp_path / "downloads", hub.base_url, progress_interval_s=0.0)
    catalog = Catalog([catalog_entry("tiny-q4", "Tiny Instruct", "Q4_K_M", "tiny-0.5b-instruct-q4_k_m.gguf"),
                       catalog_entry("tiny-q8", "Tiny Instruct", "Q8_0", "tiny-0.5b-instruct-q8_0.gguf"),
                       catalog_entry("gone", "Not On The Hub", "Q4_K_M", "missing.gguf")])
    machine = probe_host()
    dialog = ModelManagerDialog(store, catalog, downloads, settings,
                                advise=lambda e: fit_advice(e.size_bytes, e, machine))
    qtbot.addWidget(dialog)
    dialog.show()
    return dialog


def rows(dialog) -> dict[str, dict]:
    t = dialog.catalog_table.table
    out = {}
    for r in range(t.rowCount()):
        badge = t.cellWidget(r, 5).findChild(QLabel)
        out[t.item(r, 0).data(Qt.UserRole)] = {"name": t.item(r, 0).text(), "quant": t.item(r, 2).text(),
                                               "size": t.item(r, 3).text(), "badge": badge.text()}
    return out


def test_catalog_rows_get_the_hubs_sizes_distinct_names_and_badges(qtbot, held_api, manager, hub):
    qtbot.wait(50)
    before = rows(manager)
    assert all(r["size"].startswith("~") for r in before.values()), before  # estimates until the hub answers
    assert all(r["badge"] not in ("", "size unknown") for r in before.values())
    assert before["tiny-q4"]["name"] != before["tiny-q8"]["name"] and "Q8_0" in before["tiny-q8"]["name"]
    held_api.set()
    qtbot.waitUntil(lambda: "from the hub for 2 models" in manager.hub_status.text(), timeout=20_000)
    after = rows(manager)
    size_q8 = len(hub.data["tiny-0.5b-instruct-q8_0.gguf"])
    assert after["tiny-q8"]["size"] == f"{size_q8 / 1024:.1f} KiB"
    assert after["gone"]["size"].startswith("~"), "a file the hub does not list keeps its estimate"
    entry = manager.catalog_table.catalog.get("tiny-q8")
    assert entry.sha256 == sha256(hub.data["tiny-0.5b-instruct-q8_0.gguf"])


def test_hub_search_in_the_app_then_download(qtbot, manager, hub):
    search = manager.hub_search
    qtbot.keyClicks(search.query, "tiny instruct")
    with qtbot.waitSignal(search.found, timeout=20_000):
        qtbot.mouseClick(search.button, Qt.LeftButton)
    found = rows(manager)
    assert "tiny-0.5b-instruct-q4_k_m" in found and "unrelated-7b-q4_0" not in found
    assert found["tiny-0.5b-instruct-q4_k_m"]["quant"] == "Q4_K_M" and "KiB" in found["tiny-0.5b-instruct-q4_k_m"]["size"]
    with qtbot.waitSignal(manager.model_installed, timeout=60_000):
        qtbot.mouseClick(manager.catalog_table.button_for("tiny-0.5b-instruct-q4_k_m"), Qt.LeftButton)
    m = manager.store.get("tiny-0.5b-instruct-q4_k_m")
    assert m.sha256 == sha256(hub.data["tiny-0.5b-instruct-q4_k_m.gguf"])
    panel = manager.downloads_panel
    assert any("Q4_K_M" in row.name.text() for row in panel.rows.values()), "the Downloads tab names the quant"
