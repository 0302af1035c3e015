"""DownloadManager against a real HTTP server on 127.0.0.1 with injected faults.

Every fault ends in a verified, registered model or a clear failure; never a registered corrupt file.
"""
from __future__ import annotations

import errno
import json
from pathlib import Path
import ssl
import threading
import time

import httpx
import pytest

from app.catalog import CatalogEntry, CatalogFile
from app.downloads import DownloadManager, RetryPolicy
from app.store import ModelStore, sha256_file
from store_helpers import FakeHub, Fault, self_signed_cert, sha256, write_gptq_dir, write_tiny_gguf

REPO = "test/tiny-GGUF"
FAST = RetryPolicy(attempts=4, backoff_s=0.01, backoff_max_s=0.05, read_timeout_s=1.0)
HOLD = 1 << 20  # Fault.hold_at for the 2 MB payloads: half-way
PATIENT = RetryPolicy(attempts=4, backoff_s=0.01, backoff_max_s=0.05, read_timeout_s=60.0)  # waits out a hold


@pytest.fixture(scope="module")
def payloads(tmp_path_factory):
    d = tmp_path_factory.mktemp("payloads")
    return [write_tiny_gguf(d / f"m{i}.gguf", name=f"Tiny {i}", pad_mb=2, seed=i).read_bytes() for i in range(3)]


@pytest.fixture
def hub():
    with FakeHub() as h:
        yield h


@pytest.fixture
def store(tmp_path):
    return ModelStore(tmp_path / "models")


class Recorder:
    def __init__(self):
        self.events, self.lock = [], threading.Lock()

    def __call__(self, e):
        with self.lock:
            self.events.append(e)

    def states(self, job_id):
        with self.lock:
            return [e.state for e in self.events if e.job_id == job_id]


def manager(store, hub, tmp_path, **kw):
    kw.setdefault("retry", FAST)
    kw.setdefault("progress_interval_s", 0.02)
    return DownloadManager(store, tmp_path / "state", hub.base_url, **kw)


def entry(model_id, name, data=None, *, sha="known", size="known", fmt="gguf", files=None):
    if files is None:
        files = (CatalogFile(name, len(data) if size == "known" else None,
                             sha256(data) if sha == "known" else sha),)
    return CatalogEntry(id=model_id, name=model_id, family="Test", parameters="1M", architecture="llama",
                        quantization="F32", format=fmt, repo=REPO, files=files, license="apache-2.0")


def assert_nothing_left(store, model_id):
    assert store.get(model_id) is None
    assert not (store.root / model_id).exists()


def test_download_verifies_registers_and_reports_progress(hub, store, tmp_path, payloads):
    hub.add(REPO, "a.gguf", payloads[0], Fault(chunk_delay_s=0.01))
    rec = Recorder()
    dm = manager(store, hub, tmp_path)
    dm.subscribe(rec)
    job = dm.start(entry("tiny-a", "a.gguf", payloads[0]))
    final = dm.wait(job, timeout=30)
    assert final.state == "done", final.error
    m = store.get("tiny-a")
    assert m.source == "download" and m.url.endswith("/resolve/main/a.gguf") and m.sha256 == sha256(payloads[0])
    assert sha256_file(m.path) == m.sha256 and not list(store.root.rglob("*.part"))
    states = rec.states(job)
    assert states[0] == "queued" and "running" in states and states[-2:] == ["verifying", "done"]
    running = [e for e in rec.events if e.state == "running"]
    done = [e.bytes_done for e in running]
    assert done == sorted(done) and max(done) == len(payloads[0])
    assert any(e.rate_bps > 0 and e.eta_s is not None for e in running)
    with pytest.raises(ValueError, match="already installed"):
        dm.start(entry("tiny-a", "a.gguf", payloads[0]))


@pytest.mark.parametrize("fault", [Fault(drop_at=1_500_000), Fault(truncate_at=1_000_000)], ids=["reset", "truncated"])
def test_dropped_or_truncated_transfer_resumes_with_range(hub, store, tmp_path, payloads, fault):
    path = hub.add(REPO, "a.gguf", payloads[0], fault)
    dm = manager(store, hub, tmp_path)
    final = dm.wait(dm.start(entry("tiny-a", "a.gguf", payloads[0])), timeout=30)
    assert final.state == "done", final.error
    ranges = hub.ranges(path)
    assert ranges[0] is None and len(ranges) == 2
    assert int(ranges[1].removeprefix("bytes=").rstrip("-")) > 0
    assert store.verify("tiny-a")


def test_server_without_range_support_restarts_from_zero(hub, store, tmp_path, payloads):
    path = hub.add(REPO, "a.gguf", payloads[0], Fault(no_range=True, truncate_at=800_000))
    dm = manager(store, hub, tmp_path)
    final = dm.wait(dm.start(entry("tiny-a", "a.gguf", payloads[0])), timeout=30)
    assert final.state == "done", final.error
    assert hub.ranges(path)[1] is not None  # we asked to resume; the server answered 200 and we started over
    assert store.verify("tiny-a")


def test_wrong_checksum_fails_and_deletes_the_file(hub, store, tmp_path, payloads):
    hub.add(REPO, "a.gguf", payloads[0])
    dm = manager(store, hub, tmp_path)
    final = dm.wait(dm.start(entry("tiny-a", "a.gguf", payloads[0], sha="0" * 64)), timeout=30)
    assert final.state == "failed" and "sha256 mismatch" in final.error and "deleted" in final.error
    assert_nothing_left(store, "tiny-a")


def test_hub_etag_checks_files_the_catalog_has_no_hash_for(hub, store, tmp_path, payloads):
    hub.add(REPO, "good.gguf", payloads[0], Fault(etag_sha256=sha256(payloads[0])))
    hub.add(REPO, "bad.gguf", payloads[1], Fault(etag_sha256=sha256(payloads[2])))
    dm = manager(store, hub, tmp_path)
    good = dm.start(entry("good", "good.gguf", payloads[0], sha=None, size=None))
    bad = dm.start(entry("bad", "bad.gguf", payloads[1], sha=None, size=None))
    assert dm.wait(good, timeout=30).state == "done"
    assert store.get("good").sha256 == sha256(payloads[0])
    final = dm.wait(bad, timeout=30)
    assert final.state == "failed" and "sha256 mismatch" in final.error
    assert_nothing_left(store, "bad")


def test_no_hash_anywhere_records_the_computed_one(hub, store, tmp_path, payloads):
    hub.add(REPO, "a.gguf", payloads[0], Fault(chunk_delay_s=0.005))
    dm = manager(store, hub, tmp_path)
    rec = Recorder()
    dm.subscribe(rec)
    assert dm.wait(dm.start(entry("tiny-a", "a.gguf", payloads[0], sha=None, size=None)), timeout=30).state == "done"
    assert store.get("tiny-a").sha256 == sha256(payloads[0])
    running = [e for e in rec.events if e.state == "running" and 0 < e.bytes_done < len(payloads[0])]
    assert running and all(e.bytes_total == len(payloads[0]) for e in running)  # learned from Content-Length


def test_verified_bytes_that_are_not_a_model_are_never_registered(hub, store, tmp_path):
    junk = b"<html>login page</html>" * 5000
    hub.add(REPO, "a.gguf", junk)
    dm = manager(store, hub, tmp_path)
    final = dm.wait(dm.start(entry("tiny-a", "a.gguf", junk)), timeout=30)
    assert final.state == "failed" and "not a GGUF file" in final.error
    assert_nothing_left(store, "tiny-a")


def test_404_fails_at_once_and_500_is_retried(hub, store, tmp_path, payloads):
    hub.add(REPO, "flaky.gguf", payloads[0], Fault(status=500, status_times=2))
    broken = hub.add(REPO, "broken.gguf", payloads[1], Fault(status=503))
    dm = manager(store, hub, tmp_path, max_parallel=3)
    missing = dm.start(entry("missing", "missing.gguf", payloads[2]))
    flaky = dm.start(entry("flaky", "flaky.gguf", payloads[0]))
    dead = dm.start(entry("dead", "broken.gguf", payloads[1]))
    f = dm.wait(missing, timeout=30)
    assert f.state == "failed" and "HTTP 404" in f.error and "missing.gguf" in f.error
    assert len(hub.ranges(f"/{REPO}/resolve/main/missing.gguf")) == 1  # 4xx: no retry
    assert dm.wait(flaky, timeout=30).state == "done" and store.verify("flaky")
    d = dm.wait(dead, timeout=30)
    assert d.state == "failed" and "HTTP 503" in d.error and "gave up after 4 attempts" in d.error
    assert len(hub.ranges(broken)) == 4
    for mid in ("missing", "dead"):
        assert store.get(mid) is None


def test_stalled_server_times_out_and_resumes(hub, store, tmp_path, payloads):
    path = hub.add(REPO, "a.gguf", payloads[0], Fault(stall_s=1.5))
    dm = manager(store, hub, tmp_path, retry=RetryPolicy(attempts=3, backoff_s=0.01, read_timeout_s=0.5))
    final = dm.wait(dm.start(entry("tiny-a", "a.gguf", payloads[0])), timeout=30)
    assert final.state == "done", final.error
    assert len(hub.ranges(path)) == 2 and store.verify("tiny-a")


def test_full_disk_is_refused_before_the_first_byte(hub, store, tmp_path, payloads):
    path = hub.add(REPO, "a.gguf", payloads[0])
    hub.add(REPO, "b.gguf", payloads[1])

    class Usage:
        free = 10 << 20  # 10 MiB free, 64 MiB reserve wanted

    dm = manager(store, hub, tmp_path, disk_usage=lambda p: Usage)
    known = dm.wait(dm.start(entry("tiny-a", "a.gguf", payloads[0])), timeout=30)
    assert known.state == "failed" and "not enough disk space" in known.error
    assert hub.ranges(path) == []  # refused before asking
    unknown = dm.wait(dm.start(entry("tiny-b", "b.gguf", payloads[1], size=None)), timeout=30)
    assert unknown.state == "failed" and "not enough disk space" in unknown.error  # from Content-Length
    assert not list(store.root.rglob("*.part"))


def test_disk_full_mid_write_keeps_the_part_and_resumes_later(hub, store, tmp_path, payloads):
    path = hub.add(REPO, "a.gguf", payloads[0])

    class Wrapped:  # FileIO's write is read-only: wrap instead
        def __init__(self, f, limit):
            self.f, self.limit = f, limit

        def write(self, b):
            if self.f.tell() + len(b) > self.limit:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(b)

        def __getattr__(self, k):
            return getattr(self.f, k)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

    dm = manager(store, hub, tmp_path, opener=lambda p, mode, buffering=-1: Wrapped(open(p, mode, buffering), 1 << 20))
    job = dm.start(entry("tiny-a", "a.gguf", payloads[0]))
    final = dm.wait(job, timeout=30)
    assert final.state == "failed" and "disk full" in final.error
    part = store.root / "tiny-a" / "a.gguf.part"
    kept = part.stat().st_size
    assert 0 < kept <= 1 << 20 and store.get("tiny-a") is None
    dm2 = manager(store, hub, tmp_path)  # space freed, app restarted
    assert dm2.start(entry("tiny-a", "a.gguf", payloads[0])) == job  # the same job, resumed
    assert dm2.wait(job, timeout=30).state == "done"
    assert hub.ranges(path)[-1] == f"bytes={kept}-"
    assert store.verify("tiny-a")


def test_pause_resume_cancel_and_persisted_queue(hub, store, tmp_path, payloads):
    release = threading.Event()  # both transfers stop half-way until then: unfinished when halted
    path = hub.add(REPO, "a.gguf", payloads[0], Fault(chunk_delay_s=0.01, hold_at=HOLD, release=release))
    hub.add(REPO, "b.gguf", payloads[1], Fault(chunk_delay_s=0.01, hold_at=HOLD, release=release))
    dm = manager(store, hub, tmp_path, retry=PATIENT)
    a = dm.start(entry("tiny-a", "a.gguf", payloads[0]))
    b = dm.start(entry("tiny-b", "b.gguf", payloads[1]))
    _wait_for(lambda: all(e.bytes_done > 200_000 for e in dm.jobs()))
    dm.pause(a)
    dm.cancel(b)
    release.set()  # the workers see their flags at the next chunk
    assert dm.wait(a, timeout=10).state == "paused"
    assert dm.wait(b, timeout=10).state == "cancelled"
    assert_nothing_left(store, "tiny-b")
    kept = (store.root / "tiny-a" / "a.gguf.part").stat().st_size
    assert kept > 0
    queue = json.loads((tmp_path / "state" / "downloads.json").read_text())
    assert [(j["job_id"], j["state"]) for j in queue["jobs"]] == [(a, "paused")]
    hub.faults[path].chunk_delay_s = 0
    dm2 = manager(store, hub, tmp_path)  # a new process: the paused job is still there, still paused
    assert [(e.job_id, e.state) for e in dm2.jobs()] == [(a, "paused")]
    dm2.resume(a)
    assert dm2.wait(a, timeout=30).state == "done"
    assert hub.ranges(path)[-1] == f"bytes={kept}-" and store.verify("tiny-a")


def test_parallel_limit_queues_the_rest(hub, store, tmp_path, payloads):
    release = threading.Event()  # every transfer stops half-way until two were seen there at once
    for i in range(3):
        hub.add(REPO, f"{i}.gguf", payloads[i], Fault(chunk_delay_s=0.002, hold_at=HOLD, release=release))
    rec = Recorder()
    dm = manager(store, hub, tmp_path, max_parallel=2, retry=PATIENT)
    dm.subscribe(rec)
    jobs = [dm.start(entry(f"m{i}", f"{i}.gguf", payloads[i])) for i in range(3)]
    running_at_once, live = 0, set()
    for _ in range(2000):
        events = dm.jobs()
        live = {e.job_id for e in events if e.state == "running"}
        running_at_once = max(running_at_once, len(live))
        if sum(e.bytes_done >= HOLD // 2 for e in events if e.state == "running") >= 2:
            release.set()  # two at once, well under way (a third would be running by now too)
        if all(e.state == "done" for e in dm.jobs()):
            break
        time.sleep(0.005)
    assert all(dm.wait(j, timeout=30).state == "done" for j in jobs)
    assert running_at_once == 2
    assert rec.states(jobs[2]).index("running") > 0  # it waited in the queue first


def test_gptq_directory_with_shard_index_downloads_every_shard(hub, store, tmp_path):
    """Every shard the index names is fetched, then the directory installs as one model."""
    src = write_gptq_dir(tmp_path / "src")
    shard = (src / "model.safetensors").read_bytes()
    repo = "test/tiny-GPTQ"
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    for name, data in [("config.json", (src / "config.json").read_bytes()),
                       ("model.safetensors.index.json", json.dumps(index).encode()),
                       ("model-00001-of-00002.safetensors", shard), ("model-00002-of-00002.safetensors", shard)]:
        hub.files[f"/{repo}/resolve/main/{name}"] = data
    e = CatalogEntry(id="tiny-gptq", name="Tiny GPTQ", family="Test", parameters="1M", architecture="qwen2",
                     quantization="GPTQ-INT4-G32", format="gptq", repo=repo, license="apache-2.0",
                     files=(CatalogFile("config.json"), CatalogFile("model.safetensors.index.json")))
    dm = manager(store, hub, tmp_path)
    final = dm.wait(dm.start(e), timeout=30)
    assert final.state == "done", final.error
    assert {p.rsplit("/", 1)[1] for p, _ in hub.requests} == {  # the index's shards were fetched too
        "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json"}
    m = store.get("tiny-gptq")
    assert (m.format, m.quantization) == ("gptq", "GPTQ-INT4-G32")
    assert {p.name for p in Path(m.path).iterdir()} == {
        "config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors"}


def _wait_for(cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_tls_verification_is_always_on(store, tmp_path, payloads):
    tls = self_signed_cert(tmp_path)
    if tls is None:
        pytest.skip("no openssl CLI to make a certificate")
    with FakeHub(tls=tls) as hub:
        path = hub.add(REPO, "a.gguf", payloads[0])
        dm = manager(store, hub, tmp_path)
        final = dm.wait(dm.start(entry("tiny-a", "a.gguf", payloads[0])), timeout=30)
        assert final.state == "failed" and "certificate verification failed" in final.error
        assert hub.ranges(path) == []  # no request got through the handshake; and no retries
        assert_nothing_left(store, "tiny-a")


def test_two_processes_never_download_the_same_model_at_once(hub, store, tmp_path, payloads):
    path = hub.add(REPO, "a.gguf", payloads[0], Fault(chunk_delay_s=0.01))
    first = manager(store, hub, tmp_path)
    job = first.start(entry("tiny-a", "a.gguf", payloads[0]))
    _wait_for(lambda: first.jobs()[0].bytes_done > 0)
    other = DownloadManager(store, tmp_path / "state", hub.base_url, retry=FAST, autostart=False)
    assert [e.job_id for e in other.jobs()] == [job]  # it sees the persisted job...
    clash = other.wait(other.start(entry("tiny-a", "a.gguf", payloads[0])), timeout=10)
    assert clash.state == "failed" and "another Ember process" in clash.error  # ...but cannot run it
    assert first.wait(job, timeout=30).state == "done" and store.verify("tiny-a")
    assert len(hub.ranges(path)) == 1


def test_a_server_that_always_drops_still_ends(hub, store, tmp_path, payloads):
    # every response stops after 100 KB: each attempt makes progress, so only the total cap ends it
    path = hub.add(REPO, "a.gguf", payloads[0], Fault(max_body=100_000))
    dm = manager(store, hub, tmp_path, retry=RetryPolicy(attempts=3, backoff_s=0.0, max_total=5))
    final = dm.wait(dm.start(entry("tiny-a", "a.gguf", payloads[0])), timeout=30)
    assert final.state == "failed" and "gave up after 5 attempts" in final.error
    assert len(hub.ranges(path)) == 5 and store.get("tiny-a") is None


def test_catalog_hash_disagreeing_with_the_hub_is_refused_before_the_body(hub, store, tmp_path, payloads):
    hub.add(REPO, "a.gguf", payloads[0], Fault(etag_sha256=sha256(payloads[1])))
    rec = Recorder()
    dm = manager(store, hub, tmp_path)
    dm.subscribe(rec)
    final = dm.wait(dm.start(entry("tiny-a", "a.gguf", payloads[0])), timeout=30)
    assert final.state == "failed" and "the hub publishes sha256" in final.error
    assert max(e.bytes_done for e in rec.events) == 0  # refused on the headers
    assert_nothing_left(store, "tiny-a")


def test_https_with_a_trusted_certificate_works_and_a_downgrade_redirect_is_refused(hub, tmp_path, payloads):
    from app.download_fetch import DownloadError, fetch_to_part

    tls = self_signed_cert(tmp_path)
    if tls is None:
        pytest.skip("no openssl CLI to make a certificate")
    plain = hub.base_url + hub.add(REPO, "a.gguf", payloads[0])
    with FakeHub(tls=tls) as secure, httpx.Client(verify=ssl.create_default_context(cafile=str(tls[0])), follow_redirects=True) as client:
        ok = secure.base_url + secure.add(REPO, "a.gguf", payloads[0])
        down = secure.base_url + secure.add(REPO, "down.gguf", b"", Fault(redirect_to=plain))
        kw = dict(expected_size=None, on_bytes=lambda n: None, should_stop=lambda: False,
                  check_space=lambda n: None)
        fetch_to_part(client, ok, tmp_path / "ok.part", **kw)  # the client trusts the test CA: works
        assert (tmp_path / "ok.part").read_bytes() == payloads[0]
        with pytest.raises(DownloadError, match="refusing to leave TLS"):
            fetch_to_part(client, down, tmp_path / "down.part", **kw)
        assert not (tmp_path / "down.part").exists()
