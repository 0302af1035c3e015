"""Without Ember's kernels (not built, or a CPU without AVX2) everything still runs, on torch's
and llama.cpp's kernels, and the log says so. A fresh interpreter per case: the library is
loaded once per process."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SCRIPT = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s: %(message)s")
from engine.backends import load_engine
from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
engine, decision = load_engine(EngineConfig(model_path=sys.argv[1], num_kv_blocks=64), sys.argv[2])
ids = engine.tokenizer.encode("The capital of France is")
out = engine.generate([ids], SamplingParams(temperature=0.0, max_tokens=4))[0]
print("DECISION", decision.backend, "QUANTIZED", getattr(engine.runner, "quantized", None),
      "TOKENS", len(out.output_token_ids))
"""


def run(model, backend: str, tmp_path) -> str:
    env = {**os.environ, "EMBER_KERNELS_DIR": str(tmp_path / "no-kernels-here")}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(model), backend], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_auto_falls_back_to_llama_cpp(bundled_model_path, tmp_path):
    out = run(bundled_model_path, "auto", tmp_path)
    assert "DECISION llama.cpp QUANTIZED None TOKENS 4" in out, out


def test_torch_engine_falls_back_to_dense_weights_and_says_so(bundled_model_path, tmp_path):
    out = run(bundled_model_path, "torch", tmp_path)
    assert "DECISION torch QUANTIZED False TOKENS 4" in out, out
    assert "Ember's CPU kernels are not built" in out and "make install" in out, out


def test_a_library_from_other_sources_is_refused(tmp_path):
    """A library whose ABI stamp or abi() differs from this code's (a checkout updated without
    `make install`) counts as not installed: never a misread tile format."""
    import shutil

    from engine.kernel_library import ABI, abi_stamp, kernels_installed, library_path

    if not kernels_installed():
        pytest.skip("Ember's CPU kernels are not built")
    stale = tmp_path / "stale"
    stale.mkdir()
    shutil.copy(library_path(), stale / library_path().name)
    (stale / abi_stamp().name).write_text(f"{ABI - 1}\n")
    script = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
              "from engine.kernel_library import kernels_installed\n"
              "import engine.kernels as k\n"
              "print('INSTALLED', kernels_installed())\n"
              "k.ABI = k.ABI + 1  # the library's abi() now differs from what this code speaks\n"
              "print('LOADED', k.kernels() is not None)\n")
    r = subprocess.run([sys.executable, "-c", script], env={**os.environ, "EMBER_KERNELS_DIR": str(stale)},
                       capture_output=True, text=True, timeout=120)
    assert "INSTALLED False" in r.stdout and "LOADED False" in r.stdout, r.stdout + r.stderr
    assert "from other sources" in r.stdout and "make install" in r.stdout, r.stdout
