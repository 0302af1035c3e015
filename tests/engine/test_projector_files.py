"""A vision model's projector file (its mmproj GGUF, general.architecture "clip"): recognised and
refused as a chat model in words on every path (the fit check, the CLI's import with exit 2, the
store, a load), and `--mmproj PATH` taken by the commands that run a model (the served model's
spec, an installed model's manifest, or the EngineConfig) for the llama.cpp runner (auto picks
llama.cpp for it; torch, or a file that is no projector, is refused in words). The files are
tests/vlm_factory.py's tiny random vision model."""
from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys

import pytest

from app.store import ModelStore
from engine.model_files.errors import ModelFileError
from engine.model_files.manifest import ModelManifest, write_manifest
from engine.model_files.meta import read_meta
from engine.server.model_store import ModelStore as ServedModels
from engine.backends import BackendError, decide, model_footprint
from engine.config import EngineConfig
from engine.model_files.fit import MachineInfo, UnsupportedArchitecture, choose_backend
from engine.model_files.footprint import GiB
from engine.model_files.projector import PROJECTOR_REFUSAL, check_projector
from engine.serve import add_serve_args, config_kwargs, default_spec
from engine.service.loading import check_model_file
from engine.service.served_model import ModelSpec
from vlm_factory import write_tiny_vlm

MACHINE = MachineInfo(ram_free_bytes=8 * GiB, ram_total_bytes=16 * GiB, cpu_count=2)


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    return write_tiny_vlm(tmp_path_factory.mktemp("vlm"))


def test_a_projector_is_refused_as_a_model_in_words(vlm, tmp_path):
    fp = model_footprint(vlm.mmproj)
    assert fp.architecture == "clip" and not fp.llama_cpp_runs
    with pytest.raises(UnsupportedArchitecture, match="a vision projector \\(an mmproj file\\), not a model"):
        choose_backend(MACHINE, fp)
    with pytest.raises(UnsupportedArchitecture, match="--mmproj"):  # a load checks the file first
        check_model_file(ModelSpec(id="proj", path=str(vlm.mmproj)))
    store = ModelStore(tmp_path / "store")
    with pytest.raises(UnsupportedArchitecture, match=str(vlm.mmproj.name)):
        store.import_path(vlm.mmproj, model_id="proj")
    assert store.list() == [] and not list((tmp_path / "store").rglob("*.gguf"))


def test_the_cli_import_of_a_projector_exits_2_with_one_line(vlm, tmp_path):
    env = {**os.environ, "EMBER_HOME": str(tmp_path / "home")}
    r = subprocess.run([sys.executable, "-m", "app", "models", "import", str(vlm.mmproj)],
                       capture_output=True, text=True, env=env, timeout=300)
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2, r.stderr
    assert len(err) == 1 and PROJECTOR_REFUSAL in err[0] and "Traceback" not in r.stderr
    assert not list((tmp_path / "home").rglob("manifest.json"))


def test_mmproj_flag_pairs_the_served_model_with_its_projector(vlm, tmp_path):
    p = argparse.ArgumentParser()
    add_serve_args(p)
    args = p.parse_args(["--model", str(vlm.model), "--mmproj", str(vlm.mmproj)])
    spec = default_spec(args)
    assert (spec.path, spec.mmproj) == (str(vlm.model.resolve()), str(vlm.mmproj.resolve()))
    assert "mmproj" not in config_kwargs(args)  # the served model's, not every model's the server loads
    assert default_spec(p.parse_args(["--model", str(vlm.model)])).mmproj is None
    check_model_file(spec)
    with pytest.raises(ModelFileError, match="not a projector"):
        check_model_file(dataclasses.replace(spec, mmproj=str(vlm.model)))
    # an installed vision model: its manifest names the projector, the store's spec carries it
    manifest = ModelManifest.from_meta("vlm", vlm.model, read_meta(vlm.model), sha256="", size_bytes=1,
                                       source="import")
    write_manifest(tmp_path / "models", dataclasses.replace(manifest, mmproj=str(vlm.mmproj)))
    assert ServedModels(tmp_path / "models").get("vlm").mmproj == str(vlm.mmproj)


def test_mmproj_chooses_llama_cpp_and_is_checked(vlm):
    config = EngineConfig(model_path=str(vlm.model), mmproj=str(vlm.mmproj))
    assert decide(config, machine=MACHINE).backend == "llama.cpp"
    with pytest.raises(BackendError, match="llama.cpp backend only"):
        decide(config, backend="torch", machine=MACHINE)
    with pytest.raises(BackendError, match="a 'gemma3' model, not a projector"):
        decide(EngineConfig(model_path=str(vlm.model), mmproj=str(vlm.model)), machine=MACHINE)
    with pytest.raises(BackendError, match="no such file"):
        decide(EngineConfig(model_path=str(vlm.model), mmproj=str(vlm.mmproj) + ".missing"), machine=MACHINE)
    assert check_projector(vlm.mmproj) == vlm.mmproj
