"""The vision projector ("mmproj") GGUF: the second file of a vision model, never a model alone.

llama.cpp's converter writes a vision model as two GGUFs: the language model, and its projector
(general.architecture "clip": an image encoder plus the projection into the LM's embeddings),
which libmtmd loads beside the LM. A projector cannot chat, so a file that is one is refused as a
model in words that say what to do with it, and `--mmproj` must name one.
"""
from __future__ import annotations

from pathlib import Path

from engine.model_files.errors import ModelFileError
from engine.model_files.meta import read_meta

PROJECTOR_ARCHITECTURE = "clip"  # general.architecture of every mmproj file (vision and audio)
PROJECTOR_REFUSAL = ("a vision projector (an mmproj file), not a model that chats: load the language model "
                     "it belongs to and give this file as its --mmproj")


def is_projector(arch: str) -> bool:
    return arch == PROJECTOR_ARCHITECTURE


def check_projector(path: str | Path) -> Path:
    """`path` as a Path when it is a projector GGUF; else ModelFileError naming it and what it is."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelFileError(f"--mmproj {path}: no such file")
    arch = read_meta(path).architecture or "?"
    if not is_projector(arch):
        raise ModelFileError(f"--mmproj {path}: a {arch!r} model, not a projector (general.architecture "
                             f"{PROJECTOR_ARCHITECTURE!r}, the mmproj file of a vision model)")
    return path
