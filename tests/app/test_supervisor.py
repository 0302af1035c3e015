"""EngineSupervisor with a real engine child process on a tiny generated model.

Kill the child with SIGKILL mid-reply: the reply in flight fails with a clear error, the
supervisor restarts the engine on the same port, and the client works again.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from app.client import EngineClient, EngineClientError
from app.settings import Settings
from app.supervisor import EngineSupervisor
from engine_process import write_manifest
from server_util import LONG_CTX, long_max_tokens

PROMPT = [{"role": "user", "content": "Tell me a story."}]
SMALL_KV = ("--num-kv-blocks", "256")  # sizing the pool from free RAM would allocate a GiB for a tiny model
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL")


@pytest.fixture
def settings() -> Settings:
    s = Settings.load()  # under the test's own EMBER_HOME (conftest)
    s.server_port = 0
    s.backend, s.device = "torch", "cpu"
    return s


class Recorder:
    def __init__(self, sup: EngineSupervisor) -> None:
        self.states: list[str] = []
        self.messages: list[str] = []
        self.threads: set[str] = set()
        self._lock = threading.Lock()
        self._sup = sup
        sup.on_state_change(self)

    def __call__(self, state: str) -> None:
        with self._lock:
            self.states.append(state)
            self.messages.append(self._sup.message)
            self.threads.add(threading.current_thread().name)

    def wait_for(self, seq: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                it = iter(self.states)
                if all(s in it for s in seq):  # seq is a subsequence of what happened
                    return
            time.sleep(0.05)
        raise AssertionError(f"expected {seq} in {self.states}")


def no_children_left(timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_start_chat_kill_restart_stop(settings, tiny_model_factory):
    write_manifest(settings.models_dir, "tiny-other", tiny_model_factory(seed=3, hidden=32, n_heads=2, n_kv_heads=1,
                                                                         ctx=LONG_CTX))
    sup = EngineSupervisor(settings, model_path=tiny_model_factory(), backoff=(0.2, 1.0), extra_args=SMALL_KV)
    rec = Recorder(sup)
    try:
        sup.start()
        assert sup.wait_ready(120), f"{sup.state}: {sup.message}"
        rec.wait_for(["starting", "ready"], 10)  # the watcher calls back just after wait_ready returns
        assert "engine-supervisor" in rec.threads  # loading and ready come from the watcher thread
        url, pid = sup.base_url, sup.pid
        assert url.startswith("http://127.0.0.1:") and pid is not None
        with EngineClient(url, api_key=sup.api_key) as client:
            assert client.chat(PROMPT, max_tokens=4, temperature=0).usage.completion_tokens == 4
            client.load_model("tiny-other")  # switched through the API: a restart must keep it
            # The supervisor learns of the switch from its /health poll (once a second).
            deadline = time.monotonic() + 10
            while sup.model_id != "tiny-other" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert sup.model_id == "tiny-other"

            # the engine dies mid-reply (a reply long enough to be running still when the kill comes)
            stream = client.chat_stream(PROMPT, max_tokens=long_max_tokens(url, sup.api_key), ignore_eos=True)
            next(stream)
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(EngineClientError, match="lost mid-reply"):
                for _ in stream:
                    pass
            rec.wait_for(["ready", "crashed", "starting", "ready"], 120)
            crashed = rec.messages[rec.states.index("crashed")]
            assert "exited with code -9" in crashed and "restarting in" in crashed
            assert sup.restarts == 1 and sup.pid not in (None, pid)
            assert sup.base_url == url  # same port again: other programs keep working
            reply = client.chat(PROMPT, max_tokens=4, temperature=0)  # the same client works again
            assert reply.usage.completion_tokens == 4
            assert client.status()["model"] == "tiny-other"
        assert sup.log_path.exists() and b"starting:" in sup.log_path.read_bytes()
        assert sup.api_key.encode() not in sup.log_path.read_bytes()  # the key never reaches the log
    finally:
        sup.stop()
    assert sup.state == "stopped" and rec.states[-1] == "stopped"
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert no_children_left()


def test_crash_loop_ends_in_error_with_the_engine_output(settings, tiny_model_factory):
    # a flag the engine refuses: it exits at once (before importing torch), every time
    sup = EngineSupervisor(settings, model_path=tiny_model_factory(), max_restarts=2, backoff=(0.05, 0.1),
                           extra_args=("--log-level", "bogus"))
    rec = Recorder(sup)
    try:
        sup.start()
        assert not sup.wait_ready(120)
        assert sup.state == "error"
        assert "keeps failing (3 times" in sup.message and "exited with code 2" in sup.message
        assert "invalid choice: 'bogus'" in sup.message  # the child's own error, quoted from its log
        assert rec.states.count("crashed") == 2 and sup.restarts == 2
    finally:
        sup.stop()
    assert no_children_left()


@pytest.mark.slow
def test_a_model_that_fails_to_load_is_an_error_state_not_a_restart(settings, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)  # a GGUF header and nothing usable
    sup = EngineSupervisor(settings, model_path=bad, extra_args=SMALL_KV)
    try:
        sup.start()
        assert not sup.wait_ready(120)
        assert sup.state == "error" and sup.message, sup.message
        assert sup.pid is not None and sup.restarts == 0  # still serving: another model can be loaded
    finally:
        sup.stop()
    assert no_children_left()


def test_stop_right_after_start_leaves_no_process(settings, tiny_model_factory):
    sup = EngineSupervisor(settings, model_path=tiny_model_factory())
    sup.start()
    deadline = time.monotonic() + 60
    while sup.pid is None:  # stop while the child is starting up
        assert sup.state == "starting" and time.monotonic() < deadline, (sup.state, sup.message)
        time.sleep(0.01)
    sup.stop()
    assert sup.state == "stopped" and sup.base_url is None
    assert no_children_left()
    with pytest.raises(ValueError):
        EngineSupervisor(settings, model_id="a", model_path="b")


PARENT = textwrap.dedent("""
    import sys, time
    from app.settings import Settings
    from app.supervisor import EngineSupervisor
    s = Settings.load()
    s.server_port, s.backend, s.device = 0, "torch", "cpu"
    sup = EngineSupervisor(s, model_path=sys.argv[1], extra_args=("--num-kv-blocks", "256"))
    sup.start()
    assert sup.wait_ready(300), sup.message
    print(sup.pid, sup.port, flush=True)
    time.sleep(600)
""")


@pytest.mark.slow
def test_the_engine_ends_when_the_app_is_killed(tiny_model_factory):
    """No stop() call at all (the app was SIGKILLed): the engine must not live on holding its port."""
    root = Path(__file__).resolve().parents[2]
    app = subprocess.Popen([sys.executable, "-c", PARENT, str(tiny_model_factory())], cwd=root,
                           stdout=subprocess.PIPE, text=True)
    try:
        line = app.stdout.readline().split()
        assert line, "the app process failed to start its engine"
        engine_pid, port = int(line[0]), int(line[1])
        engine = psutil.Process(engine_pid)
        assert engine.is_running()
        app.kill()
        app.wait(10)
        gone, alive = psutil.wait_procs([engine], timeout=20)
        assert engine in gone, "the engine outlived the app"
        import socket
        with socket.socket() as s:  # its port is free again
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
        app.stdout.close()
