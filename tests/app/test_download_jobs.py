"""The download queue's file: job states are JobState members in memory and plain names on disk."""
from __future__ import annotations

from app.download_jobs import JobState, read_queue, write_queue
from app.downloads import DownloadManager
from app.store import ModelStore


def test_the_queue_file_keeps_plain_state_names(tmp_path):
    """A job in a state this version does not know is ignored, not a crash."""
    store = ModelStore(tmp_path / "models")
    state_dir = tmp_path / "state"
    base = {"model_id": "tiny-a", "entry": {"format": "gguf"}, "files": []}
    write_queue(state_dir, [{**base, "job_id": "a", "state": "paused"},
                            {**base, "job_id": "b", "state": "running"},  # its process died
                            {**base, "job_id": "c", "state": "exploded"}])
    dm = DownloadManager(store, state_dir, "https://hub.example", autostart=False)
    jobs = {e.job_id: e.state for e in dm.jobs()}
    assert jobs == {"a": JobState.PAUSED, "b": JobState.QUEUED} and jobs["a"] == "paused"
    dm.cancel("a")  # rewrites the file: the unknown job is carried over as it was
    assert {j["job_id"]: j["state"] for j in read_queue(state_dir)} == {"b": "queued", "c": "exploded"}
