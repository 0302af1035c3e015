"""The model manager's fit badge and the engine's own admission agree, for every catalog entry.

The badge is what app.gui_main's advisor (and `ember models list|search`) computes:
`fit_advice(entry.size_bytes, entry, machine)`. The engine's decision is `engine.backends.decide`,
the function every command that loads a model goes through, given the entry's footprint as
`model_footprint` would read it from the file, and the same MachineInfo. Where the catalog does
not know a file's size, both take the entry's estimate.
"""
from __future__ import annotations

import dataclasses

import pytest

import engine.backends as backends
from app.catalog import Catalog
from app.fit import fit_advice, probe_host
from engine.config import EngineConfig
from engine.model_files.fit import BackendError, MachineInfo
from engine.model_files.footprint import GiB, footprint_of

CATALOG = list(Catalog.load())
CPU = MachineInfo(ram_free_bytes=8 * GiB, ram_total_bytes=16 * GiB, cpu_count=4)
SYNTHETIC = {
    "cpu-2g": dataclasses.replace(CPU, ram_free_bytes=2 * GiB),
    "cpu-8g": CPU,
    "cpu-24g-bf16": dataclasses.replace(CPU, ram_free_bytes=24 * GiB, cpu_fast_bf16=True),
    "cpu-6g-no-llama.cpp": dataclasses.replace(CPU, ram_free_bytes=6 * GiB, llama_cpp_available=False),
    "cuda-6g": dataclasses.replace(CPU, cuda_available=True, cuda_free_bytes=6 * GiB, cuda_total_bytes=8 * GiB),
    "cuda-24g": dataclasses.replace(CPU, ram_free_bytes=3 * GiB, cuda_available=True,
                                    cuda_free_bytes=24 * GiB, cuda_total_bytes=24 * GiB),
    "mac-16g": dataclasses.replace(CPU, ram_free_bytes=12 * GiB, mps_available=True, mps_max_bytes=11 * GiB,
                                   llama_cpp_gpu_offload=True),
}


def engine_decision(machine: MachineInfo, entry, monkeypatch):
    """What the engine decides for this entry's file on `machine` (BackendError when it refuses)."""
    size = entry.size_bytes or entry.estimated_size_bytes
    fp = footprint_of(entry, size)
    monkeypatch.setattr(backends, "model_footprint", lambda path: fp)
    try:
        return backends.decide(EngineConfig(model_path=entry.id), machine=machine)
    except BackendError as e:
        return e


def check_agreement(machine: MachineInfo, monkeypatch) -> list[bool]:
    verdicts = []
    for entry in CATALOG:
        badge = fit_advice(entry.size_bytes, entry, machine)
        decision = engine_decision(machine, entry, monkeypatch)
        admitted = not isinstance(decision, BackendError)
        assert badge.fits == admitted, (entry.id, badge.reason, str(decision))
        if admitted:
            assert badge.device == decision.device, (entry.id, badge.reason, decision.reason)
            assert badge.max_context >= decision.context_length
            assert badge.needed_bytes >= decision.est_bytes
        else:
            assert str(decision) in badge.reason  # the badge's tooltip is the engine's refusal
        verdicts.append(admitted)
    return verdicts


@pytest.mark.parametrize("name", SYNTHETIC)
def test_badge_and_engine_agree_on_synthetic_machines(name, monkeypatch):
    check_agreement(SYNTHETIC[name], monkeypatch)


def test_the_machines_cover_both_verdicts(monkeypatch):
    verdicts = [v for m in SYNTHETIC.values() for v in check_agreement(m, monkeypatch)]
    assert any(verdicts) and not all(verdicts)  # not vacuous: some entries fit, some are refused


def test_badge_and_engine_agree_on_this_machine(monkeypatch):
    """The GUI's own probe (no torch), as the model manager sees this machine."""
    check_agreement(probe_host(), monkeypatch)


@pytest.mark.slow  # imports torch: the engine's probe, with CUDA/MPS and llama.cpp's build
def test_badge_and_engine_agree_on_the_engines_probe(monkeypatch):
    pytest.importorskip("torch")
    from engine.backends.device import probe_machine

    check_agreement(probe_machine(), monkeypatch)


def test_the_guis_kernel_types_are_the_loaders_and_its_backend_is_the_engines(bundled_model_path):
    """The GUI's torch-free list of the types Ember's kernels hold is the loader's REPACKABLE, so the
    Settings calculator names the backend the engine picks (torch on Ember's kernels for a Q4_1 file)."""
    from engine.backends.device import model_footprint
    from engine.loaders.gguf_blocks import REPACKABLE
    from engine.model_files.fit import choose_backend
    from engine.model_files.footprint import KERNEL_TYPES
    from engine.model_files.meta import read_meta

    assert KERNEL_TYPES == {t.name for t in REPACKABLE}
    machine = dataclasses.replace(CPU, ember_kernels=True)
    size = bundled_model_path.stat().st_size
    gui = choose_backend(machine, footprint_of(read_meta(bundled_model_path), size))
    engine = choose_backend(machine, model_footprint(bundled_model_path))
    assert gui.backend == engine.backend == "torch"
