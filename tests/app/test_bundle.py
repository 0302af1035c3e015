"""The desktop bundle, built and run (issue 17): `packaging/build.py` makes the PyInstaller
one-folder bundle (a few minutes on 2 cores; run in the background from the session's start, these
tests last: tests/bundle_build.py; EMBER_BUNDLE=DIR/ember reuses one already built), then the
frozen program serves the bundled model headless on Ember's compiled kernels and its GUI starts
its engine as itself: on a real X screen with a screenshot when Xvfb and xdotool are installed,
else on Qt's offscreen platform. User data must land in platformdirs' locations, never inside the
bundle."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from engine.kernel_library import kernels_installed

pytestmark = [pytest.mark.bundle, pytest.mark.slow,
              pytest.mark.skipif(not kernels_installed(), reason="the bundle needs Ember's kernels built")]


@pytest.fixture(scope="module")
def bundle(bundle_build) -> Path:
    if os.environ.get("EMBER_BUNDLE"):
        return Path(os.environ["EMBER_BUNDLE"])
    # built in the background since the session began (tests/bundle_build.py, started by conftest)
    rc, output = bundle_build.wait(timeout=1800)
    assert rc == 0, output[-6000:]
    assert "bundle:" in output  # its size report
    return bundle_build.dist / "ember"


def user_env(tmp_path: Path) -> dict[str, str]:
    """A user's environment with its own home: no EMBER_HOME, so platformdirs decides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EMBER_", "XDG_"))}
    env.update(HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "config"),
               XDG_DATA_HOME=str(tmp_path / "data"), XDG_CACHE_HOME=str(tmp_path / "cache"),
               OMP_WAIT_POLICY="PASSIVE")
    return env


def tree(path: Path) -> dict[str, tuple[int, float]]:
    return {str(f.relative_to(path)): (f.stat().st_size, f.stat().st_mtime) for f in path.rglob("*") if f.is_file()}


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen, log: Path):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (exit {proc.poll()}); log:\n"
                         + (log.read_text(errors="replace")[-4000:] if log.exists() else "(none)"))


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_the_frozen_program_serves_the_bundled_model_on_its_kernels(bundle, tmp_path):
    before = tree(bundle)
    env, key = user_env(tmp_path), secrets.token_urlsafe(16)
    (tmp_path / "key").write_text(key)
    ready, log = tmp_path / "ready.json", tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(bundle / "ember"), "serve", "--port", "0", "--ready-file", str(ready),
                                 "--api-key-file", str(tmp_path / "key"), "--threads", "1",
                                 "--log-level", "info"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        port = wait_for(lambda: ready.exists() and json.loads(ready.read_text() or "{}").get("port"),
                        180, "the frozen server's ready file", proc, log)
        base = f"http://127.0.0.1:{port}"
        health = wait_for(lambda: httpx.get(base + "/health", timeout=10).json().get("status") == "ready"
                          and httpx.get(base + "/health", timeout=10).json(), 180, "/health ready", proc, log)
        assert health["backend"] == "torch" and "Ember's kernels" in health["decision"]["reason"]
        client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
        reply = client.chat.completions.create(model=health["model"], max_tokens=12, temperature=0,
                                               messages=[{"role": "user", "content": "Say hello."}])
        assert reply.choices[0].message.content.strip() and reply.usage.completion_tokens > 0
        text = log.read_text(errors="replace")
        assert "Ember's CPU kernels: this CPU runs the" in text, text[-3000:]  # the path, in the log
    finally:
        stop(proc)
    assert (tmp_path / "config" / "ember" / "settings.json").is_file()  # platformdirs' place
    assert tree(bundle) == before, "the frozen program wrote inside its bundle"


def x_screen(tmp_path: Path) -> tuple[subprocess.Popen, str] | None:
    """A virtual X screen (with a window manager when there is one), or None without Xvfb."""
    if not (shutil.which("Xvfb") and shutil.which("xdotool") and shutil.which("import")):
        return None
    display = f":{100 + os.getpid() % 400}"
    xvfb = subprocess.Popen(["Xvfb", display, "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)
    if shutil.which("openbox"):
        subprocess.Popen(["openbox"], env=dict(os.environ, DISPLAY=display),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return xvfb, display


def test_the_frozen_gui_starts_its_engine_as_itself(bundle, tmp_path):
    env = user_env(tmp_path)
    screen = x_screen(tmp_path)
    if screen:
        env.update(DISPLAY=screen[1], QT_QPA_PLATFORM="xcb")
    else:
        env.update(QT_QPA_PLATFORM="offscreen")
    app_log = tmp_path / "data" / "ember" / "logs" / "ember.log"
    gui = subprocess.Popen([str(bundle / "ember")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: app_log.exists() and "engine ready" in app_log.read_text(errors="replace"),
                 240, "the GUI's engine ready", gui, app_log)
        kids = psutil.Process(gui.pid).children(recursive=True)
        engine = next(k for k in kids if "engine-child" in k.cmdline())
        assert engine.cmdline()[:2] == [str(bundle / "ember"), "engine-child"]
        engine_log = (tmp_path / "data" / "ember" / "logs" / "engine.log").read_text(errors="replace")
        assert "Ember's CPU kernels: this CPU runs the" in engine_log
        if screen:
            xenv = dict(os.environ, DISPLAY=screen[1])
            found = wait_for(lambda: subprocess.run(["xdotool", "search", "--onlyvisible", "--name", "^Ember$"],
                                                    env=xenv, capture_output=True, text=True).stdout.split(),
                             60, "the main window on the X screen", gui, app_log)
            assert found
            shot = tmp_path / "window.png"
            subprocess.run(["import", "-window", found[0], str(shot)], env=xenv, check=True, timeout=60)
            assert_not_blank(shot)
    finally:
        stop(gui)
        if screen:
            screen[0].terminate()
    psutil.wait_procs([engine], timeout=30)
    assert not engine.is_running(), "the engine outlived the GUI that started it"


def assert_not_blank(png: Path) -> None:
    """A window's screenshot has the menu, text and widgets: many colours, not one fill."""
    from PySide6.QtGui import QImage

    image = QImage(str(png))
    assert image.width() > 400 and image.height() > 300
    colours = {image.pixel(x, y) for x in range(0, image.width(), 7) for y in range(0, image.height(), 7)}
    assert len(colours) > 20, f"{png}: {len(colours)} colours, the window looks empty"
