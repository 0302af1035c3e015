"""A vision model in the store: its GGUF and its projector (mmproj) GGUF, paired in one manifest.

The projector lives in the model's folder (copied or moved there, or linked in place as the model
is), so removing the model removes it, and every load of the model from the store (the server's
model list, `ember chat --model ID`, the window) gets it. Files are checked as a pair before
anything is placed (engine/model_files/projector.py: a projector, of this model's width, not of an
M-RoPE kind the runner lacks).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from app.store_files import path_size, place_checked, sha256_file
from engine.model_files.manifest import ModelManifest


def projector_dest(folder: Path, src: Path, model_path: str) -> Path:
    """The projector's name in the model's folder: its own, unless the model's file has it."""
    dest = folder / src.name
    return dest.with_name("mmproj-" + src.name) if str(dest) == model_path else dest


def with_projector(m: ModelManifest, folder: Path, proj: Path, mode: str, *,
                   sha256: str | None = None) -> ModelManifest:
    """`m` paired with the projector file `proj`, placed into `folder` as `mode` says (link: in place);
    its size is then both files' (as a catalog entry's, and what a load holds)."""
    digest = sha256 or sha256_file(proj)
    if mode != "link":
        dest = projector_dest(folder, proj, m.path)
        if dest != proj:
            proj = place_checked(proj, dest, digest, move=(mode == "move"))
    return dataclasses.replace(m, mmproj=str(proj), mmproj_sha256=digest,
                               size_bytes=path_size(Path(m.path)) + proj.stat().st_size)


def sees_images(m: ModelManifest) -> bool:
    """Whether the model has its projector, there on disk (and so takes images in chats)."""
    return bool(m.mmproj) and Path(m.mmproj).is_file()
