"""GPTQ writes the same checkpoint on every CPU (issue 69): a tiny model quantized by the real
`ember quantize` in child processes whose CPU arithmetic differs the way another vendor's does:
torch's vectorized kernels off (ATEN_CPU_CAPABILITY=default) or at AVX2 instead of AVX-512, MKL
forced to its compatible code path, one thread and two, and each of Ember's kernel paths this CPU
runs. Before issue 69 (float32 Hessian products, float32 error feedback and a float32 calibration
forward) ATEN_CPU_CAPABILITY=default, =avx2 and MKL_CBWR=COMPATIBLE each gave other bytes here."""
from __future__ import annotations

import hashlib
import inspect
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from engine.kernel_paths import runnable_paths
from engine.kernel_library import cpu_flags

CHILD = """
import sys
from app.cli import main
sys.exit(main(["quantize", sys.argv[1], sys.argv[2], "--method", "gptq", "--samples", "4", "--seq-len", "64",
               "--group-size", "32", "--calibration", sys.argv[3], "--no-progress"]))
"""


def settings() -> list[dict[str, str]]:
    """Environments that change the arithmetic of torch, its BLAS and Ember's kernels."""
    envs = [{}, {"ATEN_CPU_CAPABILITY": "default"}, {"ATEN_CPU_CAPABILITY": "avx2"},
            {"OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "2"}]
    if torch.backends.mkl.is_available():
        envs.append({"MKL_CBWR": "COMPATIBLE"})
    envs += [{"EMBER_CPU_PATH": p.name.lower()} for p in runnable_paths(cpu_flags())]
    return envs


def quantize(gguf: Path, calibration: Path, out: Path, env: dict[str, str]) -> str:
    """sha256 of the checkpoint a child process writes under env."""
    run = subprocess.run([sys.executable, "-c", CHILD, str(gguf), str(out), str(calibration)],
                         env=dict(os.environ, **env), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (env, run.stderr[-2000:])
    return hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()


def test_gptq_checkpoint_bytes_do_not_depend_on_the_cpu_arithmetic(tiny_model_factory, tmp_path):
    if sys.platform != "linux":
        pytest.skip("the settings are Linux x86's")
    gguf = tiny_model_factory(arch="qwen2", hidden=256, ffn=512, n_heads=4, n_kv_heads=2, qtype=QT.F32)
    calibration = tmp_path / "calibration.txt"
    calibration.write_text(inspect.getsource(textwrap)[:12000], encoding="utf-8")
    envs = settings()
    with ThreadPoolExecutor(2) as pool:  # two children at a time: the settings, not the load, set the arithmetic
        done = pool.map(lambda k: quantize(gguf, calibration, tmp_path / f"out{k}", envs[k]), range(len(envs)))
        digests = {str(env): digest for env, digest in zip(envs, done)}
    assert len(set(digests.values())) == 1, digests
