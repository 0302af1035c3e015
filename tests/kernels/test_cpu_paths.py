"""The kernels' code paths run only where the CPU has every feature each one declares.

The paths are not a ladder: Zen 4 and the Ice Lake Xeons have AVX-512 VNNI without AVX-VNNI,
Alder Lake has AVX-VNNI without AVX-512, Zen 3 neither. The flag sets below are those CPUs'
(/proc/cpuinfo's spelling, the features that matter here), fed in rather than read from this
machine, so every machine checks every kind; the C++ table is then checked against this one
and against this machine's /proc/cpuinfo.
"""
from __future__ import annotations

import pytest

import engine.kernels as kernels_pkg
from engine.kernel_library import cpu_flags
from engine.kernels import CpuPath, available_paths, default_path, kernels
from engine.kernel_paths import FEATURES, choose_path, missing_features, runnable_paths

BASE = {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"}
AVX512 = {"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"}
CPUS = {
    "zen3": (BASE, [CpuPath.AVX2]),
    "alder_lake": (BASE | {"avx_vnni"}, [CpuPath.AVX2, CpuPath.AVX_VNNI]),
    "zen4": (BASE | AVX512 | {"avx512_vnni", "avx512_bf16"}, [CpuPath.AVX2, CpuPath.AVX512_VNNI]),
    "cascade_lake": (BASE | AVX512 | {"avx512_vnni"}, [CpuPath.AVX2, CpuPath.AVX512_VNNI]),
    "zen5": (BASE | AVX512 | {"avx512_vnni", "avx512_bf16", "avx_vnni"},
             [CpuPath.AVX2, CpuPath.AVX_VNNI, CpuPath.AVX512_VNNI]),
    "sapphire_rapids": (BASE | AVX512 | {"avx512_vnni", "avx_vnni", "amx_tile", "amx_int8"},
                        [CpuPath.AVX2, CpuPath.AVX_VNNI, CpuPath.AVX512_VNNI]),
    "avx512_without_vnni": (BASE | AVX512, [CpuPath.AVX2]),  # Skylake-X
    "no_f16c": (BASE - {"f16c"}, []),
    "sse_only": ({"sse", "sse2", "sse4_2"}, []),
}


@pytest.mark.parametrize("cpu", CPUS)
def test_runnable_paths_are_exactly_those_whose_features_the_cpu_has(cpu):
    flags, want = CPUS[cpu]
    assert runnable_paths(flags) == want
    for path in FEATURES:
        assert (path in want) == (set(FEATURES[path]) <= flags)


@pytest.mark.skipif(kernels() is None, reason="Ember's CPU kernels are not built")
@pytest.mark.parametrize("cpu", CPUS)
def test_available_paths_follow_the_flags_not_the_fastest_path(cpu, monkeypatch):
    """available_paths() and the default path on a CPU with these flags: on Zen 4 the AVX-VNNI
    path is not offered (the old ladder offered every path below the best one: SIGILL)."""
    flags, want = CPUS[cpu]
    monkeypatch.setattr(kernels_pkg, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.delenv("EMBER_CPU_PATH", raising=False)
    assert available_paths() == want
    assert default_path() == (want[-1] if want else CpuPath.NONE)


@pytest.mark.skipif(kernels() is None, reason="Ember's CPU kernels are not built")
def test_a_requested_path_the_cpu_cannot_run_is_refused_naming_what_it_lacks(monkeypatch):
    monkeypatch.setattr(kernels_pkg, "cpu_flags", lambda: frozenset(CPUS["zen4"][0]))
    monkeypatch.setenv("EMBER_CPU_PATH", "avx_vnni")
    with pytest.raises(ValueError, match="EMBER_CPU_PATH=avx_vnni: this CPU lacks avx_vnni"):
        default_path()
    monkeypatch.setenv("EMBER_CPU_PATH", "AVX2")
    assert default_path() == CpuPath.AVX2
    monkeypatch.setenv("EMBER_CPU_PATH", "avx512")
    with pytest.raises(ValueError, match="not one of avx2, avx_vnni, avx512_vnni"):
        default_path()


def test_choose_path_names_every_missing_feature():
    zen3 = CPUS["zen3"][0]
    with pytest.raises(ValueError, match=r"lacks avx512f, avx512bw, avx512vl, avx512_vnni \(it runs avx2\)"):
        choose_path("avx512_vnni", zen3)
    with pytest.raises(ValueError, match="none of the paths"):
        choose_path("avx2", CPUS["sse_only"][0])
    assert choose_path(" avx2 ", zen3) == CpuPath.AVX2
    assert choose_path("", CPUS["zen4"][0]) == CpuPath.AVX512_VNNI
    assert missing_features(CpuPath.AVX_VNNI, CPUS["zen4"][0]) == ["avx_vnni"]


@pytest.mark.skipif(kernels() is None, reason="Ember's CPU kernels are not built")
def test_the_library_declares_the_same_features_and_reads_this_cpu_as_proc_cpuinfo_does():
    """csrc/cpu_paths.cpp's table is this one, and its CPUID answers match /proc/cpuinfo's flags."""
    ops = kernels()
    flags = cpu_flags()
    for path, features in FEATURES.items():
        assert ops.path_features(int(path)).split() == list(features)
        assert ops.missing_features(int(path)).split() == missing_features(path, flags)
    runnable = runnable_paths(flags)
    assert ops.best_path() == int(runnable[-1] if runnable else CpuPath.NONE)
    for bad in (0, 4, -1):
        with pytest.raises(RuntimeError, match="does not exist"):
            ops.path_features(bad)


@pytest.mark.skipif(kernels() is None, reason="Ember's CPU kernels are not built")
def test_the_engine_refuses_a_path_this_cpu_lacks_before_loading(monkeypatch):
    """In words at the backend decision (the CLI's one `error:` line), not a traceback mid-load."""
    from engine.backends import BackendError, decide
    from engine.config import EngineConfig
    from engine.model_files.bundled import default_model_path

    monkeypatch.setattr(kernels_pkg, "cpu_flags", lambda: frozenset(CPUS["zen4"][0]))
    monkeypatch.setenv("EMBER_CPU_PATH", "avx_vnni")
    with pytest.raises(BackendError, match="this CPU lacks avx_vnni"):
        decide(EngineConfig(model_path=str(default_model_path())), backend="torch", device="cpu")
