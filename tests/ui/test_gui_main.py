"""`python -m app` (plain `ember`) as a real process: one instance, a second launch raises it, SIGTERM stops the engine."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def engine_children(proc: subprocess.Popen) -> list[psutil.Process]:
    try:
        return [c for c in psutil.Process(proc.pid).children(recursive=True)
                if "engine" in " ".join(c.cmdline())]
    except psutil.NoSuchProcess:
        return []


def test_single_instance_and_clean_quit(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "EMBER_HOME": str(tmp_path / "home"),
           "EMBER_SERVER_PORT": "0", "EMBER_BACKEND": "torch"}
    log = tmp_path / "home" / "data" / "logs" / "ember.log"
    first = subprocess.Popen([sys.executable, "-m", "app"], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: engine_children(first), 60, "the app to start its engine")
        wait_for(lambda: log.exists(), 30, "the app's log")
        second = subprocess.run([sys.executable, "-m", "app"], cwd=ROOT, env=env, timeout=60,
                                capture_output=True, text=True)
        assert second.returncode == 0
        wait_for(lambda: "another launch asked to show the window" in log.read_text(), 10,
                 "the first instance to hear the second launch")
        assert first.poll() is None
        engines = engine_children(first)
        first.send_signal(signal.SIGTERM)
        assert first.wait(60) == 0
        gone, alive = psutil.wait_procs(engines, timeout=30)
        assert not alive, "the engine outlived the app"
    finally:
        if first.poll() is None:
            first.kill()
