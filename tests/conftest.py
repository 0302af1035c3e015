"""Shared fixtures. Everyone may append fixtures here; keep them small and documented."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Tests run engine processes next to the test process on 2 cores; OpenMP threads that spin while
# waiting starve the other process (a decode step measured 1.5 s spinning, 0.27 s passive).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# never the user's settings or models, also for engines a module-scoped fixture starts before the
# per-test home below exists (their engine reads the app's settings on a pull, app/api_pull.py)
os.environ["EMBER_HOME"] = tempfile.mkdtemp(prefix="ember-test-home-")
# tests/ mirrors the source by room (engine/, kernels/, server/, app/, ui/); the helpers they share
# (gguf_factory, server_util, ui_support, corpus, ...) and data/ live here, importable from every room
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def bundled_model_path() -> Path:
    from engine.model_files.bundled import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """tiny_model_factory(**kw) -> Path of a tiny random GGUF (cached per set of arguments)."""
    from gguf_factory import write_tiny_model

    cache: dict[tuple, Path] = {}

    def make(**kw) -> Path:
        key = tuple(sorted(kw.items()))
        if key not in cache:
            path = tmp_path_factory.mktemp("tiny") / "model.gguf"
            cache[key] = write_tiny_model(path, **kw)
        return cache[key]

    return make


def pytest_collection_modifyitems(config, items):
    """The bundle tests run last: their build runs in the background meanwhile (bundle_build.py)."""
    items.sort(key=lambda item: item.get_closest_marker("bundle") is not None)  # stable: order kept


@pytest.fixture(scope="session", autouse=True)
def bundle_build(request, tmp_path_factory):
    """The desktop bundle's build, started before the first test when a bundle test will run
    (selected, not skipped, no EMBER_BUNDLE given); None otherwise."""
    from bundle_build import BackgroundBuild

    wanted = [item for item in request.session.items if item.get_closest_marker("bundle")
              and not any(m.args and m.args[0] is True for m in item.iter_markers("skipif"))]
    if not wanted or os.environ.get("EMBER_BUNDLE"):
        yield None
        return
    build = BackgroundBuild(tmp_path_factory.mktemp("bundle"))
    build.start()
    yield build
    build.stop()


@pytest.fixture(scope="session")
def computed_once(tmp_path_factory):
    """computed_once(name, make) -> make()'s result (tensors, lists, numbers, strings), made at the
    first call of the session and read back from disk after: for oracle logits that several test
    files compare against (minutes of llama.cpp on a busy CPU; hundreds of MB, so not kept in memory)."""
    import torch

    folder = tmp_path_factory.mktemp("computed-once")

    def get(name: str, make):
        path = folder / f"{name}.pt"
        if not path.exists():
            torch.save(make(), path)
        return torch.load(path)

    return get


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """Settings, data and model store of every test live in its own tmp dir, never the user's."""
    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "ember-home"))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny matmuls gain nothing from threads, and on a busy 2-core box thread hand-offs stall."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
