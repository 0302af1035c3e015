"""A real `ember models pull` process killed with SIGKILL mid-download, then run again: it resumes
from the bytes on disk (the hub sees a Range request starting there) and the file verifies."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.store import ModelStore, sha256_file
from store_helpers import FakeHub, Fault, sha256, write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_pull_killed_mid_download_resumes_and_verifies(tmp_path):
    payload = write_tiny_gguf(tmp_path / "p.gguf", name="Resume Me", pad_mb=4, seed=7).read_bytes()
    entry = {"id": "resume-test", "name": "Resume Me", "family": "Test", "parameters": "1M",
             "architecture": "llama", "quantization": "F32", "format": "gguf", "repo": "test/resume-GGUF",
             "files": [{"name": "resume.gguf", "size_bytes": len(payload), "sha256": sha256(payload)}],
             "license": "apache-2.0"}
    (tmp_path / "catalog.json").write_text(json.dumps({"models": [entry]}))
    models, data = tmp_path / "models", tmp_path / "data"
    env = {**os.environ, "EMBER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    with FakeHub() as hub:
        # ~3.5 s in all, and it stops half-way until released: the kill surely comes mid-download
        path = hub.add("test/resume-GGUF", "resume.gguf", payload, Fault(chunk_delay_s=0.05, hold_at=2 << 20))
        cmd = [sys.executable, "-m", "app.cli", "models", "pull", "resume-test", "--catalog",
               str(tmp_path / "catalog.json"), "--hub-base-url", hub.base_url, "--models-dir", str(models),
               "--data-dir", str(data), "--no-progress"]
        child = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        part = models / "resume-test" / "resume.gguf.part"
        deadline = time.monotonic() + 60
        while not (part.exists() and part.stat().st_size > 1 << 20):
            assert child.poll() is None, child.stdout.read().decode()
            assert time.monotonic() < deadline, "the child never got going"
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        child.stdout.close()
        kept = part.stat().st_size
        assert 0 < kept < len(payload)
        assert ModelStore(models).get("resume-test") is None  # a killed download is never registered
        queue = json.loads((data / "downloads" / "downloads.json").read_text())
        assert [j["model_id"] for j in queue["jobs"]] == ["resume-test"]

        hub.faults[path].chunk_delay_s = 0
        hub.faults[path].release.set()
        again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stdout + again.stderr
        ranges = hub.ranges(path)
        assert ranges[0] is None and ranges[-1] == f"bytes={kept}-"  # resumed exactly where it stopped
        assert len(ranges) == 2

    m = ModelStore(models).get("resume-test")
    assert m is not None and m.sha256 == sha256(payload) == sha256_file(m.path) and not part.exists()
    verify = subprocess.run([sys.executable, "-m", "app.cli", "models", "verify", "resume-test",
                             "--models-dir", str(models), "--data-dir", str(data)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0 and "resume-test: OK" in verify.stdout
