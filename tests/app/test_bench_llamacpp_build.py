"""The llama.cpp a benchmark compares against is named by the features its build turned on,
read from the library itself, so a ratio says which instruction sets met."""
from __future__ import annotations

from app.bench.lib.llamacpp_build import cpu_features, describe


def test_only_the_features_set_to_one_in_the_reported_order():
    info = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 0 | AVX512_VNNI = 0 | LLAMAFILE = 1 | REPACK = 1 | \n"
    assert cpu_features(info) == ["SSE3", "AVX", "AVX2", "LLAMAFILE", "REPACK"]
    assert cpu_features("") == []
    assert cpu_features("Metal : EMBED_LIBRARY = 1 | CPU : NEON = 1 | ") == ["EMBED_LIBRARY", "NEON"]


def test_the_installed_library_is_described_by_its_own_report():
    import llama_cpp

    line = describe(llama_cpp)
    assert line.startswith(f"llama.cpp: llama-cpp-python {llama_cpp.__version__}, ")
    reported = llama_cpp.llama_print_system_info().decode()
    for feature in line.split(", ")[1].split():
        assert f"{feature} = 1" in reported
