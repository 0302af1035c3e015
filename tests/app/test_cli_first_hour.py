"""The CLI a new user meets (issue 16): `--version`, the fallback to the terminal chat without a display,
`generate` through the chat template (`--raw` for plain text), `--model` by store id, Ctrl-C stopping a
reply in `ember chat` while the chat goes on, and no INFO lines in the terminal unless -v."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import app.cli_chat as cli_chat
from app.cli import main, setup_terminal_logging
from app.display_check import gui_problem
from app.version import ember_version
from server_util import LONG_CTX

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]


def ember_cmd(*argv: str) -> list[str]:
    return [sys.executable, "-m", "app", *argv]


def test_version():
    out = subprocess.run(ember_cmd("--version"), capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"ember {ember_version()}" != "ember unknown"


def test_gui_problem_names_the_missing_packages():
    have = lambda lib: f"lib{lib}.so"  # noqa: E731
    assert gui_problem({"DISPLAY": ":0"}, "linux", have) is None
    assert "no display" in gui_problem({}, "linux", have)
    line = gui_problem({"DISPLAY": ":0"}, "linux", lambda lib: None if lib in ("xcb-cursor", "xcb-icccm") else lib)
    assert "\n" not in line and line.endswith("sudo apt install libxcb-cursor0 libxcb-icccm4")
    assert gui_problem({}, "linux", have) and gui_problem({"QT_QPA_PLATFORM": "offscreen"}, "linux", have) is None
    assert gui_problem({}, "darwin", have) is None


def test_plain_ember_without_a_display_falls_back_to_the_terminal_chat(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env["EMBER_HOME"] = str(tmp_path / "home")
    out = subprocess.run(ember_cmd(), input="\n",  # the chat on the bundled model; an empty line quits
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=240)
    assert out.returncode == 0, out.stderr
    first = out.stderr.splitlines()[0]
    assert first.startswith("ember: cannot open the window: no display") and "ember chat" in first
    assert "Ember chat." in out.stderr and "Traceback" not in out.stderr
    assert " INFO " not in out.stderr, "INFO log lines in the terminal chat without -v"


def test_generate_uses_the_chat_template_unless_raw(tmp_path, tiny_model_factory, monkeypatch, capsys):
    prompts: list[str] = []
    original = cli_chat.stream
    monkeypatch.setattr(cli_chat, "stream", lambda engine, prompt, params, **kw: (
        prompts.append(prompt), original(engine, prompt, params, **kw))[1])
    model = str(tiny_model_factory())
    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "home"))
    assert main(["models", "import", model, "--id", "tiny-cli"]) == 0  # --model takes the store id
    for extra in ([], ["--raw"]):
        assert main(["generate", "Name three colours.", "-n", "3", "--model", "tiny-cli", "--backend", "torch",
                     *extra]) == 0
    templated, raw = prompts
    assert raw == "Name three colours."
    assert templated != raw and "Name three colours." in templated and "<|im_start|>assistant" in templated
    with pytest.raises(SystemExit, match="no installed model has this id"):
        main(["generate", "x", "--model", "no-such-model"])


def test_ctrl_c_stops_the_reply_and_the_chat_goes_on(tmp_path, tiny_model_factory):
    env = {**os.environ, "EMBER_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    model = str(tiny_model_factory(ctx=LONG_CTX))
    proc = subprocess.Popen(ember_cmd("chat", "--model", model, "--backend", "torch", "-n", "100000", "--ignore-eos"),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env)
    try:
        proc.stdin.write(b"Tell me a story.\n")
        proc.stdin.flush()
        os.set_blocking(proc.stdout.fileno(), False)
        seen, deadline = b"", time.monotonic() + 180
        while len(seen) < 40 and time.monotonic() < deadline:  # the reply is streaming
            seen += proc.stdout.read() or b""
            time.sleep(0.1)
        assert len(seen) >= 40, "no reply streamed"
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        proc.stdin.write(b"/reset\nHello\n\n")  # the chat is still there, and answers again
        proc.stdin.flush()
        proc.stdin.close()
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    os.set_blocking(proc.stdout.fileno(), True)
    out = (seen + proc.stdout.read()).decode("utf-8", "replace")
    err = proc.stderr.read().decode("utf-8", "replace")
    assert proc.returncode == 0, err
    assert "[stopped]" in out and "Traceback" not in err and "KeyboardInterrupt" not in err
    assert out.count("> ") >= 3, out[-300:]  # prompts after the stop: /reset, Hello, then the empty line


def test_terminal_logging_is_quiet_unless_verbose():
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    try:
        setup_terminal_logging(False)
        mine = [h for h in root.handlers if h.get_name() == "ember-terminal"]
        assert len(mine) == 1 and mine[0].level == logging.WARNING
        assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)  # no line per /health poll
        setup_terminal_logging(True)
        mine = [h for h in root.handlers if h.get_name() == "ember-terminal"]
        assert len(mine) == 1 and mine[0].level == logging.DEBUG
    finally:
        root.handlers[:] = before
        root.setLevel(level)
        logging.getLogger("httpx").setLevel(logging.NOTSET)
        logging.getLogger("httpcore").setLevel(logging.NOTSET)
        logging.getLogger("httpx2").setLevel(logging.NOTSET)
