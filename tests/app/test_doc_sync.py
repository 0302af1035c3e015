"""The Documents view's Qt-free parts: a file's state in words, the time left from the measured rate,
and Sync's plan from the attributes the window keeps (path and sha256) against the real disk."""
from __future__ import annotations

from app.doc_sync import IndexClock, file_attributes, plan_sync, status_words
from app.store import sha256_file


def test_states_in_words():
    assert status_words({"status": "in_progress"}) == "Waiting to be indexed"
    going = {"status": "in_progress", "progress": {"chunks_done": 40, "chunks_total": 400}}
    assert status_words(going) == "Indexing: 40 of 400 passages"
    assert status_words(going, 95) == "Indexing: 40 of 400 passages, 2 min left"
    assert status_words({"status": "completed", "chunks": 1}) == "Indexed: 1 passage"
    assert status_words({"status": "completed", "usage_bytes": 3200}) == "Indexed (3.2 KB)"
    failed = {"status": "failed", "last_error": {"code": "server_error", "message": "the PDF is encrypted"}}
    assert status_words(failed) == "Failed: the PDF is encrypted"


def test_time_left_comes_from_the_rate_measured_since_the_file_was_first_seen():
    clock = IndexClock()
    assert clock.seconds_left("f", 10, 110, now=100.0) is None  # one look: no rate yet
    assert clock.seconds_left("f", 30, 110, now=110.0) == 40.0  # 20 passages in 10 s, 80 to go
    assert clock.seconds_left("f", 110, 110, now=120.0) is None  # done


def test_sync_plans_changed_and_gone_files_from_their_attributes(tmp_path):
    same, changed, gone = (tmp_path / n for n in ("same.md", "changed.md", "gone.md"))
    for p in (same, changed, gone):
        p.write_text(f"# {p.name}\n")
    files = [{"id": f"file-{p.stem}", "attributes": file_attributes(p)} for p in (same, changed, gone)]
    files.append({"id": "file-api", "attributes": {}})  # added by another program: left alone
    assert files[0]["attributes"] == {"path": str(same.resolve()), "sha256": sha256_file(same)}
    changed.write_text("# changed since\n")
    gone.unlink()
    plan = plan_sync(files)
    assert plan.changed == [("file-changed", changed.resolve())] and plan.gone == ["file-gone"]
