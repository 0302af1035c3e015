"""The desktop bundle's parts that need no build (issue 17): the freedesktop files, the icons, and
how a frozen program finds its resources and starts its own engine. tests/app/test_bundle.py builds
the bundle and runs it."""
from __future__ import annotations

import configparser
import importlib.util
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx

from app import frozen
from app.engine_process import EngineProcess
from app.frozen import ember_command, engine_child_command
from resources import resource_path

PACKAGING = Path(__file__).resolve().parents[2] / "packaging"


def load_build_script():
    spec = importlib.util.spec_from_file_location("ember_packaging_build", PACKAGING / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


APP_ID = load_build_script().APP_ID


def desktop_entry() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # keys are case-sensitive in the Desktop Entry spec
    parser.read(PACKAGING / f"{APP_ID}.desktop", encoding="utf-8")
    return parser["Desktop Entry"]


def test_desktop_entry_and_metainfo_name_the_same_app():
    entry = desktop_entry()
    assert entry["Type"] == "Application" and entry["Terminal"] == "false"
    assert entry["Exec"].split()[0] == "ember"  # install.sh links the bundle's program onto PATH
    assert entry["Icon"] == APP_ID
    assert entry["Categories"].endswith(";") and entry["StartupWMClass"] == "ember"
    meta = ET.parse(PACKAGING / f"{APP_ID}.metainfo.xml").getroot()
    assert meta.get("type") == "desktop-application" and meta.findtext("id") == APP_ID
    assert meta.find("launchable").text == f"{APP_ID}.desktop"
    assert meta.find("provides/binary").text == "ember"
    assert meta.findtext("metadata_license") and meta.findtext("project_license") == "Apache-2.0"
    if shutil.which("desktop-file-validate"):
        out = subprocess.run(["desktop-file-validate", str(PACKAGING / f"{APP_ID}.desktop")],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr


def test_icons_render_at_every_usual_size(tmp_path):
    from PySide6.QtGui import QImage

    build = load_build_script()
    paths = build.render_icons(PACKAGING / "icons" / f"{APP_ID}.svg", tmp_path)
    assert [p.relative_to(tmp_path).parts[0] for p in paths] == [f"{n}x{n}" for n in build.ICON_SIZES]
    for size, path in zip(build.ICON_SIZES, paths):
        image = QImage(str(path))
        assert (image.width(), image.height()) == (size, size)
        alphas = {image.pixelColor(x, y).alpha() for x in range(size) for y in range(size)}
        assert 0 in alphas and 255 in alphas, f"{path}: the icon should be drawn on a transparent ground"


def test_resources_come_from_the_bundle_when_frozen(monkeypatch, tmp_path):
    assert resource_path("catalog.json").is_file() and resource_path("icons/ember.svg").is_file()
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert resource_path("catalog.json") == tmp_path / "resources" / "catalog.json"


def test_a_frozen_program_starts_its_engine_as_itself(monkeypatch, tmp_path):
    assert engine_child_command() == [sys.executable, "-m", "app.engine_child"]
    assert ember_command() == [sys.executable, "-m", "app"]
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", "/opt/ember/ember")
    assert ember_command() == ["/opt/ember/ember"]
    command = EngineProcess(["--model", "m.gguf"], api_key=None, log_path=tmp_path / "log").command
    assert command[:3] == ["/opt/ember/ember", "engine-child", "--parent-pid"]
    assert command[4:7] == ["serve", "--model", "m.gguf"]


def test_the_engine_child_command_serves_through_the_cli(monkeypatch, tmp_path, tiny_model_factory):
    """What a bundle runs (`ember engine-child ... serve`), here as `python -m app engine-child`:
    a real engine, started by the real EngineProcess, through app.cli's dispatch."""
    from server_util import start_engine, tiny_model

    monkeypatch.setattr(frozen, "engine_child_command", lambda: [sys.executable, "-m", "app", "engine-child"])
    proc = start_engine(tiny_model(tiny_model_factory), tmp_path)
    try:
        assert proc.proc.args[3:5] == ["engine-child", "--parent-pid"]
        r = httpx.get(proc.base_url + "/health", timeout=10)
        assert r.json()["status"] == "ready"
    finally:
        proc.stop()


def test_the_engine_child_command_refuses_bad_arguments():
    out = subprocess.run([sys.executable, "-m", "app", "engine-child", "serve"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "usage" in out.stderr


def test_install_script_is_portable_shell():
    text = (PACKAGING / "install.sh").read_text()
    assert text.startswith("#!/bin/sh\n") and "set -eu" in text
    subprocess.run(["sh", "-n", str(PACKAGING / "install.sh")], check=True)
