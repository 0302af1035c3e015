"""A checkpoint folder the engine does not load as it is (a sentence-transformers BERT: the
embedders users already have) imported by converting it, once, to a GGUF in the store.

The folder is read, never changed: nothing is moved or linked whatever the import mode. Its
manifest records where it came from and a hash of the files the conversion read, so importing the
same checkpoint again returns the installed model instead of converting it again.
"""
from __future__ import annotations

import hashlib
import logging
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from engine.model_files.bert_folder import is_bert_folder, read_bert_folder
from engine.model_files.bert_gguf import convert_bert_folder
from engine.model_files.manifest import ModelManifest, slugify, write_manifest

log = logging.getLogger(__name__)

__all__ = ["converts", "import_converted"]


class Store(Protocol):
    """What the conversion needs of the model store (app/store.py's ModelStore)."""

    root: Path

    def list(self) -> list[ModelManifest]: ...

    def import_path(self, path: Path, *, model_id: str | None = None, mode: str | None = None) -> ModelManifest: ...


def converts(path: Path) -> bool:
    """Whether the store imports `path` by converting it: a BERT folder without quantization, or
    any sentence-transformers folder (one that is not BERT is refused saying so)."""
    path = Path(path)
    return path.is_dir() and (is_bert_folder(path) or (path / "modules.json").is_file())


def import_converted(store: Store, src: Path, *, model_id: str | None = None,
                     outtype: str = "f16") -> ModelManifest:
    """Convert `src` into the store (ModelFileError naming what llama.cpp cannot run, before
    anything is written), or return the model already converted from the same files."""
    folder = read_bert_folder(src)
    digest = _files_sha256(src, folder.source_files(), outtype)
    for m in store.list():
        if m.converted_from_sha256 == digest and Path(m.path).is_file():
            log.info("%s is already installed as %s", src, m.id)
            return m
    store.root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=store.root, prefix=".convert-") as tmp:  # no manifest: not a model
        out = convert_bert_folder(src, Path(tmp) / f"{slugify(folder.name)}.gguf", outtype)
        manifest = store.import_path(out, model_id=model_id, mode="move")
    manifest = replace(manifest, converted_from=str(src), converted_from_sha256=digest)
    write_manifest(store.root, manifest)
    log.info("converted %s to %s (%s)", src, manifest.path, manifest.quantization)
    return manifest


def _files_sha256(root: Path, files: list[Path], outtype: str) -> str:
    """sha256 over the sorted lines `relpath\\0sha256(file)\\n` of the files read, and the outtype."""
    h = hashlib.sha256(f"outtype\0{outtype}\n".encode())
    for p in sorted(files):
        inner = hashlib.sha256()
        with open(p, "rb") as f:
            while block := f.read(1 << 20):
                inner.update(block)
        h.update(f"{p.relative_to(root).as_posix()}\0{inner.hexdigest()}\n".encode())
    return h.hexdigest()
