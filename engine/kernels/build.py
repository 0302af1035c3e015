"""Compile Ember's C++ kernels against the installed torch: run by `make install`, never at a chat.

    python -m engine.kernels.build        # -> <venv>/lib/ember_kernels/ember_kernels.so

One shared library holds every CPU code path (AVX-512 VNNI, AVX-VNNI, AVX2), each function
compiled for its own target by attribute, so the binary runs on any x86-64 CPU and the path is
chosen at run time (engine/kernels/__init__.py). -fopenmp is what makes `at::parallel_for` use
torch's thread pool; without it every op silently runs on one thread.
"""
from __future__ import annotations

import platform
import shutil
import sys
import time
from pathlib import Path

from engine.kernel_library import ABI, CSRC, NAME, abi_stamp, library_dir, library_path


def build(verbose: bool = False) -> Path:
    from torch.utils import cpp_extension

    if platform.machine() not in ("x86_64", "AMD64"):
        raise RuntimeError(f"Ember's CPU kernels are x86-64 only (this machine: {platform.machine()})")
    library_path().unlink(missing_ok=True)  # a failed build leaves no stale library behind
    abi_stamp().unlink(missing_ok=True)
    work = library_dir() / "build"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.perf_counter()
    cpp_extension.load(
        name=NAME, sources=sorted(str(p) for p in CSRC.glob("*.cpp")), build_directory=str(work),
        extra_cflags=["-O3", "-fopenmp", "-fno-math-errno", "-ffp-contract=off", "-DNDEBUG"],
        extra_ldflags=["-fopenmp"],
        is_python_module=False, verbose=verbose)
    built = work / f"{NAME}.so"
    target = library_path()
    built.replace(target)
    abi_stamp().write_text(f"{ABI}\n")
    shutil.rmtree(work, ignore_errors=True)
    print(f"built {target} in {time.perf_counter() - t0:.0f} s")
    return target


if __name__ == "__main__":
    build(verbose="-v" in sys.argv)
